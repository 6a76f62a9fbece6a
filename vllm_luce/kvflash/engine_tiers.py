"""KVFlash's tiers bound to vLLM's scheduler (engine core): the ``HostAdmission`` of ``admission.py`` built from the
scheduler's KV cache configuration and the settings, handed to the KVFlash managers, and what the scheduler shows:
its metrics, the engine's facts for the frontend's check (``kvflash/frontend.py``) and each request's length limit.
"""

from __future__ import annotations

import json
import math
import os

import torch

from vllm_luce import metrics
from vllm_luce.metrics.store import DIR_ENV
from vllm_luce.kvflash.admission import AdmissionConfig, HostAdmission
from vllm_luce.kvflash.host_ledger import engine_tag, open_ledger, sharing_unknown
from vllm_luce.kvflash.plan import KVFlashPlan
from vllm_luce.kvflash.settings import ledger_path, longest_page_out, resolve_request_bytes
from vllm_luce.log import logger, tag

# Free KV blocks never lent to cold chunks, as a share of the cache: other requests' pools are admitted from them.
COLD_HEADROOM = 0.1
FACTS_FILE = "kvflash-admission-{}.json"
_FACTS: dict[str, dict] = {}  # this process's engines' facts (one process serves everything without multiprocessing)


def engine_of(vllm_config) -> int:
    """The engine's tag in the host ledger: its engine core and workers compute it alike."""
    parallel = getattr(vllm_config, "parallel_config", None)
    return engine_tag(getattr(vllm_config, "instance_id", ""), getattr(parallel, "data_parallel_rank", 0))


def chunk_bytes_per_rank(spec, layers: int, chunk_tokens: int) -> int:
    """One chunk of K and V of ``layers`` pooled layers on one rank: what a page-out copies (``PagedPoolStore``)."""
    head_v = getattr(spec, "head_size_v", None) or spec.head_size
    return layers * chunk_tokens * spec.num_kv_heads * (spec.head_size + head_v) * torch.empty(
        0, dtype=spec.dtype).element_size()


def build_admission(scheduler, luce, plan: KVFlashPlan) -> HostAdmission | None:
    """The engine's admission for its KVFlash managers (None without a pooled group), for the scheduler's plan."""
    from vllm_luce.kvflash.spec import KVFlashManager

    managers = [m for m in scheduler.kv_cache_manager.coordinator.single_type_managers if isinstance(m, KVFlashManager)]
    if not managers:
        return None
    kv, vllm_config = luce.kvflash, scheduler.vllm_config
    cfg = plan.pager
    group = scheduler.kv_cache_config.kv_cache_groups[managers[0].kv_cache_group_id]
    ranks = vllm_config.parallel_config.tensor_parallel_size
    chunk_bytes = ranks * chunk_bytes_per_rank(group.kv_cache_spec, len(group.layer_names), cfg.chunk_tokens)
    engine = engine_of(vllm_config)
    ledger = open_ledger(ledger_path(kv.host_ledger), kv.host_bytes)
    longest = longest_page_out(vllm_config.model_config.max_model_len, cfg.pool_tokens, cfg.chunk_tokens, chunk_bytes)
    config = AdmissionConfig(
        chunk_tokens=cfg.chunk_tokens, pool_chunks=cfg.pool_chunks, block_size=group.kv_cache_spec.block_size,
        chunk_bytes=chunk_bytes, request_bytes=resolve_request_bytes(kv.host_request_bytes, ledger.budget, longest),
        reserve_blocks=reserve_blocks(scheduler), gpu_cold=kv.gpu_cold,
        wait_s=float(kv.host_wait_s))
    if kv.host_bytes == "auto" and sharing_unknown():
        logger.warning("%s: KVFlash: this server runs in a container with no memory limit, so whether servers in "
                       "other containers count the same host memory is unknown (each /dev/shm has its own ledger): "
                       "host_bytes auto is a quarter of the memory available, not half. Set a memory limit, share "
                       "/dev/shm between the containers (--ipc=host), or set luce.kvflash.host_bytes", tag())
    waits = kv.host_full == "wait"
    admission = HostAdmission(config, ledger if waits else None, engine, ledger.held("pinned", engine))
    admission.end_step()  # this engine's pageable slot starts empty
    for manager in managers:
        manager.luce_admission = admission
    scheduler.luce_kvflash_manager = managers[0]  # the scheduler's pre-allocation check (scheduler.py)
    lookahead = getattr(scheduler, "num_lookahead_tokens", 0) or 0
    # the frontend's limit is ``config.max_tokens(margin, n)``: a prompt's first step writes up to a chunk beyond it
    publish_facts(vllm_config, {"pool_chunks": cfg.pool_chunks, "chunk_tokens": cfg.chunk_tokens,
                                "chunk_bytes": chunk_bytes, "request_bytes": config.request_bytes,
                                "margin": lookahead + cfg.chunk_tokens, "pool_tokens": cfg.pool_tokens,
                                "budget": ledger.budget, "waits": waits})
    logger.info("%s: KVFlash tiers: cold chunks in free KV blocks %s (%d blocks kept free), then host memory: budget "
                "%.1f GiB for this host (%s, %s when spent), %.1f GiB pinned by this engine, %.2f GiB at most per "
                "request (contexts up to %d tokens), %.1f MiB a chunk", tag(), "on" if kv.gpu_cold else "off",
                config.reserve_blocks, ledger.budget / 2**30, ledger.path, "requests wait" if waits else "drop chunks",
                admission.pinned / 2**30, config.request_bytes / 2**30, config.max_tokens(lookahead), chunk_bytes / 2**20)
    return admission


def reserve_blocks(scheduler) -> int:
    """Free blocks never lent: a tenth of the cache (or vLLM's watermark) for other requests' admission, and what one
    request's step can take in every group after the pooled one."""
    kv_config, sched = scheduler.kv_cache_config, scheduler.scheduler_config
    step = (getattr(scheduler, "max_num_scheduled_tokens", 0) or sched.max_num_batched_tokens) + \
        (getattr(scheduler, "num_lookahead_tokens", 0) or 0)
    per_step = sum(math.ceil(step / g.kv_cache_spec.block_size) + 2 for g in kv_config.kv_cache_groups)
    watermark = getattr(sched, "watermark", 0.0) or 0.0
    return math.ceil(max(COLD_HEADROOM, watermark) * kv_config.num_blocks) + per_step


def report(admission: HostAdmission, labels: dict, step_end: bool = True) -> None:
    """After the scheduler's step (``step_end``: reservations not allocated go back, the requests held back are
    counted) or its outputs (finished requests have returned theirs): the tiers' state into metrics."""
    if step_end:
        metrics.set_gauge("kvflash_held_back_requests", admission.end_step(), **labels)
        metrics.set_total("kvflash_held_back_steps", admission.refusals, **labels)
        metrics.set_total("kvflash_lent_blocks_returned", admission.returned_blocks, **labels)
    elif not admission.total():  # no reservation left (the engine may go idle): the claim returns to the host now
        admission.settle()
    metrics.set_gauge("kvflash_host_reserved_bytes", admission.total(), **labels)
    metrics.set_total("kvflash_host_wait_errors", admission.expired, **labels)
    if admission.ledger is not None:
        metrics.set_gauge("kvflash_host_budget_bytes", admission.ledger.budget, **labels)


def publish_facts(vllm_config, facts: dict) -> None:
    """What the frontend needs to refuse a request that could never fit (the engine core writes; the API server
    reads, through the server's metrics folder)."""
    key = str(vllm_config.instance_id)
    _FACTS[key] = facts
    folder = os.environ.get(DIR_ENV)
    if folder:  # named by the API server at startup; its processes' first metric snapshot may not have made it yet
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, FACTS_FILE.format(key))
        with open(path + f".{os.getpid()}", "w") as f:
            json.dump(facts, f)
        os.replace(path + f".{os.getpid()}", path)


def read_facts(vllm_config) -> dict | None:
    key = str(getattr(vllm_config, "instance_id", ""))
    if key in _FACTS:
        return _FACTS[key]
    folder = os.environ.get(DIR_ENV)
    try:
        with open(os.path.join(folder or "", FACTS_FILE.format(key))) as f:
            _FACTS[key] = json.load(f)
    except (OSError, ValueError):
        return None
    return _FACTS[key]
