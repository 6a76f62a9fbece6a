"""The initialize_kv_cache wrapper binds the features once, after vLLM's real KV cache: never on V1's profiling call
(a minimal KV cache for CUDA graph memory), where a second binding made every pooled layer capture its queries
twice a step."""

from types import SimpleNamespace

import pytest

from vllm_luce.patches import initialize_kv_cache_v1
from vllm_luce.patches.initialize_kv_cache import binding_wrapper


@pytest.fixture
def bound(monkeypatch):
    calls = []
    hook = SimpleNamespace(feature="KVFlash", function=lambda: lambda runner, luce: calls.append(runner.config))
    monkeypatch.setattr("vllm_luce.hooks.features", lambda *a, **k: [hook] if k.get("target") else [])
    on = SimpleNamespace(kvflash=SimpleNamespace(on_when_used=lambda: True))
    monkeypatch.setattr("vllm_luce.config.LuceConfig.from_vllm_config", staticmethod(lambda cfg: on))
    return calls


def initialize(runner, config, *args, **kwargs):
    runner.config = config


@pytest.mark.parametrize("how", ["keyword", "positional"])
def test_binds_after_the_real_kv_cache_and_not_on_the_profiling_one(bound, how):
    wrapped = binding_wrapper(initialize_kv_cache_v1.TARGET)(initialize)
    runner = SimpleNamespace(vllm_config=None)
    if how == "keyword":  # GPUModelRunner.profile_cudagraph_memory's call
        wrapped(runner, "minimal", is_profiling=True)
    else:  # CPUModelRunner passes is_profiling through super() positionally
        wrapped(runner, "minimal", True)
    assert runner.config == "minimal" and bound == []
    wrapped(runner, "real")
    wrapped(runner, "real again", False)
    assert bound == ["real", "real again"]
