"""Patch: free the device memory held for KVFlash and PFlash once vLLM 0.34 has sized its extensible KV cache (see
LEDGER). The holding is ``device_reserve.py``'s, done by the initialize_kv_cache patches."""

from __future__ import annotations

import functools

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import device_reserve, wrap_method

TARGET = "vllm.v1.worker.gpu_worker:Worker.extend_kv_cache"


def _make_wrapper(original):
    @functools.wraps(original)
    def extend_kv_cache(self, num_blocks, *args, **kwargs):
        original(self, num_blocks, *args, **kwargs)
        device_reserve.release(self.model_runner)

    return extend_kv_cache


def apply() -> bool:
    from vllm.v1.worker.gpu_worker import Worker

    return wrap_method(Worker, "extend_kv_cache", ledger_signature(TARGET), _make_wrapper)
