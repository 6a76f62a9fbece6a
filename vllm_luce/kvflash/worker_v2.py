"""KVFlash bound to vLLM's Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``, the GPU default
in 0.33). Same ``KVFlashRuntime`` as V1, assembled alike (``worker.assemble_runtime``, the policy scorer included:
its token ids come from V2's request states); V2's objects differ:

* block ids arrive through ``BlockTables.append_block_ids(req_index, new_block_ids, overwrite)``
  (staged for the GPU); the pooled group's rows are mirrored here on the host for the pagers;
* ``BlockTables.compute_slot_mappings`` returns ``[groups, tokens]``; the pooled group's row is
  replaced by the pagers' slots (rows are batch order through ``idx_mapping``). It is handed device
  tensors only; the step's ``InputBatch`` (noted as ``prepare_attn`` receives it) holds their host
  mirrors, so the step need not wait for the device (without a speculator, whose drafts make V2's
  host counts an upper bound, each request's first position is its computed-token count);
* finished and preempted requests come through ``finish_requests(scheduler_output)``, and so do the rows the scheduler
  cut (``luce_cold_rows``: lent blocks taken back), before the step's blocks are appended.
Attention metadata builders and query capture are bound as in V1, with the pieces both runners share (``worker.py``);
``worker_v1.py`` binds Model Runner V1. The block ownership audit reads V1's block tables and is off here.

Run end to end by the GPU tier on V1 and V2 (tests/gpu/test_kvflash.py, docs/gpu.md); on CPU, tested against V2's
interfaces with stand-in objects (tests/kvflash/test_worker_v2.py).
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_luce import hooks
from vllm_luce.kvflash.kv_store import to_device_async
from vllm_luce.kvflash.runtime import KVFlashRuntime
from vllm_luce.kvflash.worker import (PooledBuilder, RunnerView, assemble_runtime, capture_queries, first_positions,
                                      local_query_heads, policy_label, pooled_group)
from vllm_luce.log import logger, tag


def bind_v2(runner, luce) -> KVFlashRuntime:
    gid = pooled_group(runner.kv_cache_config)
    group = runner.kv_cache_config.kv_cache_groups[gid]
    forward_context = runner.compilation_config.static_forward_context
    block_tables = runner.block_tables
    runtime = assemble_runtime(runner, luce, RunnerView(gid, block_tables.block_sizes[gid], block_tables.max_num_reqs,
                                                        _tokens_of(runner), audits=False))
    rows: dict[int, np.ndarray] = {}
    empty = np.zeros(0, dtype=np.int64)
    append_block_ids = block_tables.append_block_ids

    def append_block_ids_mirrored(req_index, new_block_ids, overwrite):
        append_block_ids(req_index, new_block_ids, overwrite)
        row = empty if overwrite else rows.get(req_index, empty)
        rows[req_index] = np.concatenate([row, np.asarray(new_block_ids[gid], dtype=np.int64)])

    noted: dict = {}  # the step's InputBatch while prepare_attn runs
    prepare_attn = runner.prepare_attn

    def prepare_attn_noting(input_batch):
        noted["batch"] = input_batch
        try:
            return prepare_attn(input_batch)
        finally:
            noted.clear()

    compute_slot_mappings = block_tables.compute_slot_mappings

    def compute_slot_mappings_pooled(idx_mapping, query_start_loc, positions, num_tokens_padded, out=None):
        slot_mappings = compute_slot_mappings(idx_mapping, query_start_loc, positions, num_tokens_padded, out)
        batch = noted.get("batch")
        if batch is not None and batch.idx_mapping is idx_mapping:  # host mirrors: no wait for the device
            req_indices, req_ids = batch.idx_mapping_np[: batch.num_reqs], list(batch.req_ids[: batch.num_reqs])
            qsl = batch.query_start_loc_np
            exact = getattr(runner, "speculator", None) is None
            starts = batch.num_computed_tokens_np[: batch.num_reqs] if exact else first_positions(qsl, positions)
        else:  # reading the device's copies waits for the step in flight
            req_indices = idx_mapping.cpu().numpy()
            req_ids = [runner.req_states.index_to_req_id[int(i)] for i in req_indices]
            qsl = query_start_loc.cpu().numpy()
            starts = first_positions(qsl, positions)
        found = [rows.get(int(i), empty) for i in req_indices]
        counts = np.array([len(row) for row in found], dtype=np.int64)
        table = np.zeros((len(found), max(int(counts.max(initial=0)), 1)), dtype=np.int64)
        for r, row in enumerate(found):
            table[r, : len(row)] = row
        slots = runtime.plan(req_ids, qsl, starts, table, counts, runner.req_states.prompt_len.np[req_indices])
        slot_mappings[gid, : len(slots)].copy_(to_device_async(torch.from_numpy(slots), slot_mappings.device))
        return slot_mappings

    finish_requests = runner.finish_requests

    def finish_requests_releasing(scheduler_output):
        runtime.release(scheduler_output.finished_req_ids)
        runtime.release(scheduler_output.preempted_req_ids or ())
        for req_id in set(scheduler_output.finished_req_ids) | set(scheduler_output.preempted_req_ids or ()):
            index = runner.req_states.req_id_to_index.get(req_id)
            if index is not None:
                rows.pop(index, None)
        # rows the scheduler cut (lent blocks taken back): cold chunks out first, then the row ends at the cut,
        # before this step's blocks are appended
        for req_id, blocks in (getattr(scheduler_output, "luce_cold_rows", None) or {}).items():
            index = runner.req_states.req_id_to_index.get(req_id)
            if index is not None and index in rows:
                runtime.give_back(req_id, rows[index], blocks)
                rows[index] = rows[index][:blocks]
                per = getattr(block_tables, "blocks_per_kv_block", None)  # kernel blocks per KV block (vLLM 0.26)
                block_tables.num_blocks.np[gid, index] = min(int(block_tables.num_blocks.np[gid, index]),
                                                             blocks * (per[gid] if per else 1))
        return finish_requests(scheduler_output)

    hooks.bind("vllm.v1.worker.gpu.block_table:BlockTables.append_block_ids", block_tables, append_block_ids_mirrored)
    hooks.bind("vllm.v1.worker.gpu.block_table:BlockTables.compute_slot_mappings", block_tables,
               compute_slot_mappings_pooled)
    hooks.bind("vllm.v1.worker.gpu.model_runner:GPUModelRunner.finish_requests", runner, finish_requests_releasing)
    hooks.bind("vllm.v1.worker.gpu.model_runner:GPUModelRunner.prepare_attn", runner, prepare_attn_noting)
    for attn_group in runner.attn_groups[gid]:
        builders = [PooledBuilder(b, runtime) for b in attn_group.metadata_builders]
        hooks.bind("vllm.v1.worker.utils:AttentionGroup.metadata_builders", attn_group, builders)
    for index, name in enumerate(group.layer_names):
        capture_queries(forward_context[name], index, runtime)
    runner.luce_kvflash = runtime
    runtime.warm_up(local_query_heads(runner.vllm_config))
    logger.info("%s: KVFlash (Model Runner V2) on %d layers, pool %d tokens, policy %s", tag(),
                len(group.layer_names), runtime.config.pool_tokens, policy_label(runtime))
    if luce.kvflash.audit:  # the plan asked for it; V2's view does not audit
        logger.warning("%s: luce.kvflash.audit checks Model Runner V1's block tables only; it is off on V2", tag())
    return runtime


def _tokens_of(runner):
    """A request's prompt and output token ids, and its prompt length, from V2's request states (the scorer's): V2
    keeps the output tokens on the device only, so a scoring pass (once every ``refresh_tokens`` tokens of a request)
    waits for the step in flight."""
    states = runner.req_states

    def tokens_of(req_id: str) -> tuple[list[int], int]:
        index = states.req_id_to_index[req_id]
        total = int(states.total_len.gpu[index])
        return states.all_token_ids.gpu[index, :total].tolist(), int(states.prompt_len.np[index])

    return tokens_of
