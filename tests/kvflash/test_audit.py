import numpy as np

from vllm_luce.kvflash.audit import Audit, shared_blocks, stray_slots


def table(rows: list[list[int]], width: int = 6, per_block: int = 1) -> tuple[np.ndarray, np.ndarray, int]:
    t = np.full((len(rows) + 2, width), 77, dtype=np.int32)  # rows past the step and entries past a count: stale
    for i, r in enumerate(rows):
        t[i, : len(r)] = r
    counts = np.zeros(len(rows) + 2, dtype=np.int32)
    counts[: len(rows)] = [len(r) for r in rows]
    return t, counts, per_block


def test_blocks_held_once_pass_and_null_blocks_are_shared():
    assert shared_blocks([table([[1, 2], [3, 0]]), table([[4, 0], [5, 6]])], num_reqs=2) == []


def test_a_block_in_two_rows_or_two_groups_is_found():
    assert shared_blocks([table([[1, 2], [3, 2]])], num_reqs=2) == [(2, 0, 0, 0, 1)]
    assert shared_blocks([table([[1, 2], [3]]), table([[4], [1]])], num_reqs=2) == [(1, 0, 0, 1, 1)]


def test_kernel_blocks_of_one_block_are_one_block():
    """vLLM 0.26 splits a block into kernel blocks in some groups: entries 6, 7, 8 are block 2 at 3 a block."""
    split = table([[6, 7, 8], [9, 10, 11]], per_block=3)
    assert shared_blocks([split, table([[1], [4]])], num_reqs=2) == []
    assert shared_blocks([split, table([[2], [4]])], num_reqs=2) == [(2, 0, 0, 1, 0)]


def test_stale_entries_past_a_rows_count_are_not_its_blocks():
    t, counts, _ = table([[1, 2], [3]])
    qsl = np.array([0, 2, 3])
    assert stray_slots(np.array([16, 47, 48]), qsl, t, counts, block_size=16) == []
    # the second request's token written into block 77: stale in its row, another request's now
    assert stray_slots(np.array([16, 47, 77 * 16 + 5]), qsl, t, counts, block_size=16) == [(1, 77 * 16 + 5)]
    assert stray_slots(np.array([-1, 47, 48]), qsl, t, counts, block_size=16) == []


def test_audit_counts_over_steps():
    audit = Audit()
    group = table([[1, 2], [3, 2]])
    audit.check([group], 2, np.array([16, 33]), np.array([0, 1, 2]), 0, 16, ["a", "b"])
    audit.check([group], 1, np.array([16]), np.array([0, 1]), 0, 16, ["a"])
    assert audit.stats() == {"audit_steps": 2, "audit_shared_blocks": 1, "audit_stray_slots": 0}
