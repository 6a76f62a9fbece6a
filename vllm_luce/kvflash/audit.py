"""Block ownership audit, a diagnostic for the GPU tier (``luce.kvflash.audit``, Model Runner V1): each step,
before the forward, no KV cache block is held by two rows of the step's requests in any KV cache group, and every
slot the pooled group's slot mapping writes lies in its own request's blocks. Either failing means a request's KV
(or recurrent state) can be written by another's step. Plain numpy over the block table's host rows."""

from __future__ import annotations

import numpy as np

NULL_BLOCK = 0  # vLLM's null block: padding and skipped entries, in many rows at once


def shared_blocks(groups: list[tuple[np.ndarray, np.ndarray, int]], num_reqs: int) -> list[tuple[int, ...]]:
    """Blocks held by two (group, row) places at once: ``(block, group, row, other group, other row)``.
    ``groups``: each KV cache group's block table rows, its rows' entry counts and, where vLLM splits a block into
    kernel blocks (0.26's ``blocks_per_kv_block``), how many entries one block takes (1 where it does not)."""
    owner: dict[int, tuple[int, int]] = {}
    found = []
    for gid, (table, counts, per_block) in enumerate(groups):
        for row in range(num_reqs):
            for block in dict.fromkeys((table[row, : int(counts[row])] // per_block).tolist()):
                if block == NULL_BLOCK:
                    continue
                first = owner.setdefault(block, (gid, row))
                if first != (gid, row):
                    found.append((block, *first, gid, row))
    return found


def stray_slots(slots: np.ndarray, query_start_loc: np.ndarray, table: np.ndarray, counts: np.ndarray,
                block_size: int) -> list[tuple[int, int]]:
    """``(row, slot)`` of the step's tokens whose slot is outside their row's blocks (-1: not written, skipped)."""
    found = []
    for row in range(len(query_start_loc) - 1):
        mine = table[row, : int(counts[row])]
        for slot in slots[int(query_start_loc[row]): int(query_start_loc[row + 1])].tolist():
            if slot >= 0 and slot // block_size not in mine:
                found.append((row, slot))
    return found


class Audit:
    """Counts of what ``shared_blocks`` and ``stray_slots`` found over the steps, the first few logged."""

    def __init__(self, log_first: int = 8):
        self.steps = self.shared = self.stray = 0
        self._left = log_first

    def check(self, groups, num_reqs: int, slots, query_start_loc, pooled: int, block_size: int, req_ids) -> None:
        from vllm_luce.log import logger, tag

        self.steps += 1
        shared = shared_blocks(groups, num_reqs)
        table, counts, _ = groups[pooled]
        stray = stray_slots(slots, query_start_loc, table, counts, block_size)
        self.shared += len(shared)
        self.stray += len(stray)
        if (shared or stray) and self._left > 0:
            self._left -= 1
            logger.warning("%s: KVFlash audit, step %d: blocks held twice (block, group, row, group, row) %s; slots "
                           "outside their row (row, slot) %s; rows: %s", tag(), self.steps, shared[:8], stray[:8],
                           list(req_ids)[:num_reqs])

    def stats(self) -> dict[str, int]:
        return {"audit_steps": self.steps, "audit_shared_blocks": self.shared, "audit_stray_slots": self.stray}
