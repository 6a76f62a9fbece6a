"""Patch: vLLM's ``replay_boundaries`` is memoized (see LEDGER).

Each scheduled request calls it on every step (``KVCacheCoordinator.cache_blocks``, from
``allocate_slots``), even with prefix caching off, where no manager reads the answer. With an
EAGLE-family drafter (DFlash included) it builds, sorts and converts a set: 1.0 us a call against
0.2 us without a drafter, in a warm loop on the 2-core CI host. In the engine at batch 64 (wrapped
timing, every step, plain or speculative) ``cache_blocks`` took 145 us a step more than without a
drafter; cached, 7 us. The answer depends only on its three integer arguments and is an immutable
tuple, so a bounded cache returns the same object vLLM would build (0.26 us a call, with a drafter or
without).
"""

from __future__ import annotations

import functools

from vllm_luce.patches import ledger_signature, wrap_function

TARGET = "vllm.v1.core.kv_cache_coordinator:replay_boundaries"
CACHED_PROMPT_LENGTHS = 4096  # distinct (prompt length, block size, drafter) answers kept


def _make_wrapper(original):
    return functools.lru_cache(maxsize=CACHED_PROMPT_LENGTHS)(original)


def apply() -> bool:
    from vllm.v1.core import kv_cache_coordinator

    return wrap_function(kv_cache_coordinator, "replay_boundaries", ledger_signature(TARGET), _make_wrapper)
