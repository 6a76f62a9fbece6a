"""KVFlash's worker side, what the bindings to vLLM's two model runners share: the runtime (``runtime.py``) plans each
step, and ``worker_v1.py`` (Model Runner V1, and the CPU runner built on it) and ``worker_v2.py`` (Model Runner V2)
bind it to the runner's objects after ``initialize_kv_cache``. Both use what is here: the pooled KV cache group, one
runtime assembly (``assemble_runtime``: each binding describes its runner in a ``RunnerView``, and the plan, caches,
policy scorer, audit and options are put together alike), the attention metadata builders' wrapper (``PooledBuilder``:
attention and CUDA graph capture read the resident lengths), the pooled layers' query capture, the salient policy's
scored dims and the TP reduction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch

from vllm_luce import hooks, metrics
from vllm_luce.kernels.scored_dims import FAST_PAIRS, ScoredDims
from vllm_luce.kvflash.audit import Audit
from vllm_luce.kvflash.cache_layout import cache_layout
from vllm_luce.kvflash.kv_store import to_device_async
from vllm_luce.kvflash.plan import KVFlashPlan, plan_of
from vllm_luce.kvflash.runtime import KVFlashRuntime
from vllm_luce.kvflash.settings import ledger_path


def kvflash_groups(kv_cache_config) -> list[int]:
    from vllm_luce.kvflash.spec import KVFlashSpec

    return [gid for gid, g in enumerate(kv_cache_config.kv_cache_groups) if isinstance(g.kv_cache_spec, KVFlashSpec)]


def pooled_group(kv_cache_config) -> int:
    """The one KV cache group of KVFlash layers. None at all means the layers were merged into another
    group or the model has no Luce executor: KVFlash would silently do nothing, so that stops startup."""
    groups = kvflash_groups(kv_cache_config)
    if not groups:
        raise RuntimeError("luce.kvflash: no KV cache group of pooled full-attention layers. KVFlash needs a model "
                           "served by a vllm-luce executor (Qwen3.5/3.6, Gemma 4, Laguna) with VLLM_LUCE_EXECUTORS "
                           "not off")
    if len(groups) > 1:
        sizes = [len(kv_cache_config.kv_cache_groups[g].layer_names) for g in groups]
        raise RuntimeError(f"luce.kvflash: vLLM split the model's full-attention layers into {len(groups)} KV cache "
                           f"groups of {sizes} layers (it makes groups of equal size, and this model has more "
                           "full-attention layers than layers of another kind); KVFlash pools one group: turn "
                           "luce.kvflash off for this model")
    return groups[0]


def local_query_heads(vllm_config) -> int | None:
    """This rank's query heads (for the warm-up's scoring shapes); None where the config cannot say."""
    try:
        return vllm_config.model_config.get_num_attention_heads(vllm_config.parallel_config)
    except Exception:  # noqa: BLE001 - a config without heads (unit tests): the warm-up skips scoring
        return None


def scored_dims(model, layer_names) -> ScoredDims:
    """The head dims the salient policy keeps and scores (``policies.Salient``), from the pooled layers' RoPE (their
    attention module's ``rotary_emb``; every dim where the layers differ or have none): the dims it leaves alone
    where it rotates part of each head, as Qwen3.5/3.6 (the first quarter), Laguna (the first half) and Gemma 4 (the
    first quarter of each neox half: rotary_dim is the head, the other frequencies 0) do; where every pair rotates,
    all but the FAST_PAIRS fastest."""
    modules = dict(model.named_modules())
    found = {_rotation(getattr(modules.get(name.rsplit(".", 1)[0]), "rotary_emb", None)) for name in layer_names}
    if len(found) != 1 or None in found:
        return ScoredDims()
    ((rotated, head, neox, pairs),) = found
    if rotated < head:
        return ScoredDims(rotated)
    skip = pairs if pairs < head // 2 else FAST_PAIRS  # rotating pairs: the first ``pairs`` frequencies
    if not neox:  # pairs (2i, 2i + 1): the first 2 * skip dims
        return ScoredDims(2 * skip)
    # Pairs (i, i + D/2). The kernels read even runs: an odd one keeps the slowest pair it left out.
    return ScoredDims(skip - (head // 2 - skip) % 2, head // 2)


def policy_label(runtime) -> str:
    """The policy's name for the startup log, with the head dims a salient summary keeps."""
    scored, head = getattr(runtime.policy, "scored", None), runtime.head_size
    if scored is None:
        return runtime.policy.name
    return f"{runtime.policy.name} ({scored.count(head)} of {head} head dims scored)"


def _rotation(rotary) -> tuple[int, int, bool, int] | None:
    """(rotary_dim, head_size, neox, rotating pairs) of a vLLM RotaryEmbedding: the pairs whose frequency is not 0
    (their sine at position 1 is not), all of them where it keeps no cos/sin cache; None for anything else."""
    rotated, head = getattr(rotary, "rotary_dim", None), getattr(rotary, "head_size", None)
    if not (isinstance(rotated, int) and isinstance(head, int) and 0 < rotated <= head and rotated % 2 == 0):
        return None
    cache = getattr(rotary, "cos_sin_cache", None)
    pairs = rotated // 2
    if isinstance(cache, torch.Tensor) and cache.dim() == 2 and cache.shape[0] > 1 and cache.shape[1] == rotated:
        pairs = int((cache[1, rotated // 2:] != 0).sum())
    return rotated, head, bool(getattr(rotary, "is_neox_style", True)), pairs


@dataclass(frozen=True)
class RunnerView:
    """What the runtime's assembly needs of one model runner that V1 and V2 keep in different places."""

    gid: int  # the pooled KV cache group
    block_size: int  # of the pooled group's block table
    max_num_reqs: int
    tokens_of: Callable[[str], tuple[list[int], int]]  # request -> (prompt and output token ids, prompt length)
    audits: bool  # the block ownership audit reads this runner's block tables (audit.py)


def assemble_runtime(runner, luce, view: RunnerView) -> KVFlashRuntime:
    """KVFlash's runtime for one runner, put together alike for V1 and V2: the plan (``plan.py``), the pooled layers'
    caches and layout, the policy (for 'scorer', PFlash's drafter is attached later by
    ``vllm_luce/scorer_policy.py``, with the view's ``tokens_of``), the audit and the worker's options."""
    plan = plan_of(luce, runner.vllm_config)
    group = runner.kv_cache_config.kv_cache_groups[view.gid]
    forward_context = runner.compilation_config.static_forward_context
    caches = [forward_context[name].kv_cache for name in group.layer_names]
    caches = [c[0] if isinstance(c, list) else c for c in caches]
    layout = cache_layout(runner.attn_groups[view.gid][0].backend.get_name(), forward_context[group.layer_names[0]],
                          group.kv_cache_spec, caches[0].shape[2])
    return KVFlashRuntime(plan.pager, plan.policy, caches, layout, group.kv_cache_spec.head_size, view.block_size,
                          view.max_num_reqs, tokens_of=view.tokens_of, reduce_max=tp_reduce_max(),
                          scored_dims=scored_dims(runner.get_model(), group.layer_names),
                          audit=Audit() if plan.audit and view.audits else None,
                          **runtime_options(runner.vllm_config, luce, plan))


def runtime_options(vllm_config, luce, plan: KVFlashPlan) -> dict:
    """The plan's selection and query window, and this worker's host ledger, budget and metric labels. The scheduler
    keeps paged-out KV within the host's budget (``admission.py``); with host_full 'drop' each worker drops chunks
    beyond its share of it instead."""
    from vllm.distributed import get_tensor_model_parallel_rank

    from vllm_luce.kvflash.engine_tiers import engine_of
    from vllm_luce.kvflash.host_ledger import open_ledger

    kv, parallel = luce.kvflash, vllm_config.parallel_config
    try:
        rank = get_tensor_model_parallel_rank()
    except (AssertionError, RuntimeError):  # no parallel state (unit tests)
        rank = 0
    ledger = open_ledger(ledger_path(kv.host_ledger), kv.host_bytes) if plan.pages else None
    local_ranks = parallel.tensor_parallel_size * parallel.pipeline_parallel_size
    drop_budget = ledger.budget // local_ranks if ledger is not None and kv.host_full == "drop" else None
    return {"host_budget": drop_budget, "ledger": ledger, "engine": engine_of(vllm_config),
            "host_pinned": kv.host_pinned_bytes, "host_request": kv.host_request_bytes, "ranks": local_ranks,
            "max_model_len": vllm_config.model_config.max_model_len,
            "selection": plan.selection, "query_window": plan.query_window, "draft_tokens": plan.draft_tokens,
            "metric_labels": {"model_name": metrics.model_name(vllm_config), "rank": rank},
            "log_choices": bool(kv.log_choices) and rank == 0,  # the ranks choose alike (a reduced score)
            "verify_pages": bool(kv.verify_pages)}


def first_positions(query_start_loc: np.ndarray, positions: torch.Tensor) -> np.ndarray:
    """Each request's first scheduled position, read from the device's positions (a sync)."""
    first = np.minimum(query_start_loc[:-1], max(positions.shape[0] - 1, 0))
    return positions.cpu().numpy()[first]


class PooledBuilder:
    """Wraps the group's attention metadata builder: attention reads the resident tokens only.

    vLLM captures a CUDA graph through ``build_for_cudagraph_capture``, whose default calls ``build`` on the
    builder itself: unwrapped, the graph would keep reading vLLM's own ``seq_lens`` (the whole context) on every
    replay. So capture goes through ``_pooled`` too, at the lengths a pool can have."""

    supports_update_block_table = False  # vLLM's shortcut reuses another build's metadata: never for the pool

    def __init__(self, inner, runtime: KVFlashRuntime):
        self._inner, self._runtime = inner, runtime

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _pooled(self, cm, capture: bool = False):
        n, runtime = cm.num_reqs, self._runtime
        # ``num_reqs`` counts a graph's padding rows; the pagers' rows end at the step's requests, and the padding
        # keeps vLLM's lengths (0): the pagers' rows there hold an earlier step's requests
        live = n if capture else min(n, len(runtime.step_req_ids))
        lens = runtime.graph_buffer("seq_lens", cm.seq_lens)
        if capture:  # vLLM's capture lengths, within what a pool holds (SFI's dense steps read everything)
            cap = cm.max_seq_len if runtime.sfi else min(cm.max_seq_len, runtime.config.pool_tokens)
            torch.clamp(cm.seq_lens, max=cap, out=lens)
            lens_cpu = torch.full((n,), cap, dtype=torch.int32)
        else:
            lens_cpu = runtime.resident_lens[:live]
            lens.copy_(cm.seq_lens)
            if live:
                lens[:live].copy_(to_device_async(lens_cpu.to(lens.dtype), lens.device))
        changes = dict(seq_lens=lens, max_seq_len=int(lens_cpu.max()) if live else 0)
        if runtime.sfi:  # fast steps: a row starts at its selection's first block
            table = runtime.graph_buffer("block_table", cm.block_table_tensor)
            table.copy_(cm.block_table_tensor)
            width, skips = table.shape[1], runtime.skip_blocks[:live]
            for r in torch.nonzero(skips).flatten().tolist():
                s = int(skips[r])
                table[r, : width - s] = cm.block_table_tensor[r, s:]
            changes["block_table_tensor"] = table
        if cm.seq_lens_cpu_upper_bound is not None:
            upper = cm.seq_lens_cpu_upper_bound.clone()
            upper[:live] = torch.minimum(upper[:live], lens_cpu.to(upper.dtype) + cm.max_query_len)
            changes["seq_lens_cpu_upper_bound"] = upper
        return replace(cm, **changes)

    def build(self, common_prefix_len, common_attn_metadata, *args, **kwargs):
        return self._inner.build(0, self._pooled(common_attn_metadata), *args, **kwargs)

    def build_for_cudagraph_capture(self, common_attn_metadata):
        return self._inner.build_for_cudagraph_capture(self._pooled(common_attn_metadata, capture=True))

    def build_for_drafting(self, common_attn_metadata, draft_index):
        return self._inner.build_for_drafting(self._pooled(common_attn_metadata), draft_index)


def capture_queries(layer, index: int, runtime: KVFlashRuntime) -> None:
    impl = layer.impl
    forward = impl.forward

    def forward_observed(layer_, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        if attn_metadata is not None:
            runtime.observe_queries(index, query[: attn_metadata.num_actual_tokens])
        return forward(layer_, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)

    hooks.bind("vllm.v1.attention.backend:AttentionImpl.forward", impl, forward_observed)


def tp_reduce_max():
    """MAX all-reduce over the tensor-parallel group, so QK residency decisions agree across ranks."""
    try:
        from vllm.distributed import get_tensor_model_parallel_world_size
        if get_tensor_model_parallel_world_size() == 1:
            return None
    except Exception:  # no distributed state (unit tests)
        return None
    import torch.distributed as dist
    from vllm.distributed import get_tp_group

    def reduce_max(t: torch.Tensor) -> torch.Tensor:
        group = get_tp_group()
        reduced = t.to(group.device)
        dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=group.device_group)
        return reduced.to(t.device)

    return reduce_max
