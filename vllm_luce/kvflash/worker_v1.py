"""KVFlash bound to vLLM's Model Runner V1 (``vllm/v1/worker/gpu_model_runner.py``, and the CPU runner built on it)
after ``initialize_kv_cache``: the runtime is assembled as for V2 (``worker.assemble_runtime``, from this runner's
view), the pooled group's slot mapping comes from the pagers, its attention metadata builders and the pooled layers'
query capture are bound with the pieces both runners share (``worker.py``), finished and
preempted requests release their pagers, and rows the scheduler cut (lent blocks taken back) move their cold chunks
out and shrink. ``worker_v2.py`` binds Model Runner V2.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_luce import hooks
from vllm_luce.kvflash.runtime import KVFlashRuntime
from vllm_luce.kvflash.worker import (PooledBuilder, RunnerView, assemble_runtime, capture_queries, first_positions,
                                      local_query_heads, policy_label, pooled_group)
from vllm_luce.log import logger, tag


def bind_v1(runner, luce) -> KVFlashRuntime:
    """Attach KVFlash to a V1 GPUModelRunner (or CPUModelRunner) after initialize_kv_cache."""
    gid = pooled_group(runner.kv_cache_config)
    group = runner.kv_cache_config.kv_cache_groups[gid]
    block_table = runner.input_batch.block_table[gid]
    runtime = assemble_runtime(runner, luce, RunnerView(gid, block_table.block_size, runner.input_batch.max_num_reqs,
                                                        _tokens_of(runner), audits=True))
    _bind_slot_mapping(runner, gid, runtime)
    for attn_group in runner.attn_groups[gid]:
        builders = [PooledBuilder(b, runtime) for b in attn_group.metadata_builders]
        hooks.bind("vllm.v1.worker.utils:AttentionGroup.metadata_builders", attn_group, builders)
    forward_context = runner.compilation_config.static_forward_context
    for index, name in enumerate(group.layer_names):
        capture_queries(forward_context[name], index, runtime)
    _bind_release(runner, runtime)
    runner.luce_kvflash = runtime
    runtime.warm_up(local_query_heads(runner.vllm_config))
    cfg = runtime.config
    logger.info("%s: KVFlash on %d layers (group %d, block %d): %s %d tokens in chunks of %d, policy %s", tag(),
                len(group.layer_names), gid, block_table.block_size,
                "SFI, decode attends to" if runtime.sfi else "pool", cfg.pool_tokens,
                cfg.chunk_tokens, policy_label(runtime))
    return runtime


def _tokens_of(runner):
    """A request's prompt and output token ids, and its prompt length, from V1's request states (the scorer's)."""

    def tokens_of(req_id: str) -> tuple[list[int], int]:
        state = runner.requests[req_id]
        prompt = list(state.prompt_token_ids or [])
        return prompt + list(state.output_token_ids), len(prompt)

    return tokens_of


def _bind_slot_mapping(runner, gid: int, runtime: KVFlashRuntime) -> None:
    """The pooled group's slot mapping comes from the pagers instead of ``row[pos // block]``."""
    block_table = runner.input_batch.block_table[gid]

    def compute_slot_mapping(num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor) -> None:
        batch = runner.input_batch
        qsl = runner.query_start_loc.np[: num_reqs + 1]
        if getattr(runner, "use_async_spec_decode", False):  # the host's counts assume every draft accepted
            starts = first_positions(qsl, positions)
        else:  # from the host: reading the GPU's positions waited for the step in flight (no async overlap)
            starts = batch.num_computed_tokens_cpu[:num_reqs]
        slots = runtime.plan(batch.req_ids[:num_reqs], qsl, starts, block_table.block_table.np,
                             block_table.num_blocks_per_row, batch.num_prompt_tokens)
        n = len(slots)
        block_table.slot_mapping.np[:n] = slots
        block_table.slot_mapping.copy_to_gpu(n)
        if runtime.audit is not None:
            groups = [(t.block_table.np, t.num_blocks_per_row, getattr(t, "blocks_per_kv_block", 1))
                      for t in batch.block_table.block_tables]
            runtime.audit.check(groups, num_reqs, slots, qsl, gid, block_table.block_size, batch.req_ids)

    hooks.bind("vllm.v1.worker.block_table:BlockTable.compute_slot_mapping", block_table, compute_slot_mapping)


def _bind_release(runner, runtime: KVFlashRuntime) -> None:
    update_states = runner._update_states
    gid = pooled_group(runner.kv_cache_config)

    def _update_states(scheduler_output, *args, **kwargs):
        runtime.release(scheduler_output.finished_req_ids)
        runtime.release(scheduler_output.preempted_req_ids or ())
        cuts = getattr(scheduler_output, "luce_cold_rows", None)
        if cuts:  # before vLLM moves rows and appends this step's blocks
            give_back(runner, gid, runtime, cuts)
        return update_states(scheduler_output, *args, **kwargs)

    hooks.bind("vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states", runner, _update_states)


def give_back(runner, gid: int, runtime: KVFlashRuntime, cuts: dict[str, int]) -> None:
    """Rows the scheduler cut to ``cuts[request]`` blocks (lent blocks taken back for other requests): each pager
    moves the cold chunks there out while its store still reads the whole row, then the row ends at the cut in the
    persistent batch and in the request's state, which re-adds it after a step away."""
    table = runner.input_batch.block_table[gid]
    per = getattr(table, "blocks_per_kv_block", 1)  # kernel blocks per KV block (vLLM 0.26)
    for req_id, blocks in cuts.items():
        index, state = runner.input_batch.req_id_to_index.get(req_id), runner.requests.get(req_id)
        if index is not None:
            row = table.block_table.np[index, : table.num_blocks_per_row[index]].astype(np.int64)
            table.num_blocks_per_row[index] = min(int(table.num_blocks_per_row[index]), blocks * per)
        elif state is not None:
            ids = np.asarray(state.block_ids[gid], dtype=np.int64)
            row = (ids[:, None] * per + np.arange(per)).reshape(-1)
        else:
            continue
        runtime.give_back(req_id, row, blocks * per)
        if state is not None:
            del state.block_ids[gid][blocks:]
