"""vLLM 0.34's extensible KV cache: the features' device memory for after the cache is sized is held from the cache's
creation (initialize_kv_cache with extensible=True) until vLLM's Worker.extend_kv_cache has sized it, and freed then;
a release whose cache is sized first (every other call) holds nothing. vLLM 0.34 is not run here: stand-ins."""

from types import SimpleNamespace

import pytest
import torch

from vllm_luce.patches import device_reserve, extend_kv_cache, initialize_kv_cache_v2
from vllm_luce.patches.initialize_kv_cache import binding_wrapper
from vllm_luce.pflash.scorer import measured_peak


class Runner(SimpleNamespace):
    """A V2 runner once the features are bound: KVFlash's runtime and PFlash's service say what they take."""

    def __init__(self, kvflash_bytes=3000, pflash_bytes=500):
        asked = []
        kvflash = SimpleNamespace(device_bytes_after_sizing=lambda blocks, heads: asked.append((blocks, heads))
                                  or kvflash_bytes)
        pflash = SimpleNamespace(device_bytes_after_sizing=lambda tokens: asked.append(tokens) or pflash_bytes)
        config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=4096,
                                                              get_num_attention_heads=lambda parallel: 8),
                                 parallel_config=None)
        super().__init__(vllm_config=config, kv_cache_config=SimpleNamespace(num_blocks=77), device="cpu",
                         luce_kvflash=kvflash, luce_pflash=pflash, asked=asked)


@pytest.fixture
def no_features(monkeypatch):
    monkeypatch.setattr("vllm_luce.hooks.features", lambda *a, **k: [])
    monkeypatch.setattr("vllm_luce.config.LuceConfig.from_vllm_config", staticmethod(lambda cfg: None))


def initialize(runner, config, *args, **kwargs):
    runner.config = config


@pytest.mark.parametrize("how", ["keyword", "positional"])
def test_the_extensible_cache_holds_the_features_bytes_until_it_is_sized(no_features, how):
    wrapped = binding_wrapper(initialize_kv_cache_v2.TARGET)(initialize)
    runner = Runner()
    if how == "keyword":  # vLLM 0.34's Worker.initialize_from_config
        wrapped(runner, "capacity", kv_cache_allocation_context=None, extensible=True)
    else:
        wrapped(runner, "capacity", False, None, True)
    held = runner.luce_device_reserve
    assert held.numel() == 3500 and held.dtype == torch.uint8 and held.device.type == "cpu"
    assert runner.asked == [(77, 8), 4096]  # the cache's capacity and this rank's query heads; the longest prompt

    sized = []
    extend = extend_kv_cache._make_wrapper(lambda worker, num_blocks: sized.append(num_blocks))
    extend(SimpleNamespace(model_runner=runner), 60)
    assert sized == [60] and runner.luce_device_reserve is None
    extend(SimpleNamespace(model_runner=runner), 60)  # nothing left to free
    assert device_reserve.release(runner) == 0


def test_a_cache_sized_before_it_is_created_holds_nothing(no_features):
    wrapped = binding_wrapper(initialize_kv_cache_v2.TARGET)(initialize)
    for call in ((), (False, None), (False, None, False)):
        runner = Runner()
        wrapped(runner, "sized", *call)
        assert getattr(runner, "luce_device_reserve", None) is None and runner.asked == []
    runner = Runner(kvflash_bytes=0, pflash_bytes=0)
    wrapped(runner, "capacity", extensible=True)
    assert getattr(runner, "luce_device_reserve", None) is None  # nothing to hold


def test_without_the_features_nothing_is_asked():
    runner = Runner()
    runner.luce_kvflash = runner.luce_pflash = None  # PFlash off, or a rank other than 0
    assert device_reserve.features_device_bytes(runner) == 0 and runner.asked == []


def test_a_scoring_pass_is_measured_from_the_allocators_peak():
    counters = {"allocated": 100, "peak": 100}

    def run():
        counters["peak"] = 900  # a transient of 800 bytes over the 100 held before
        counters["allocated"] = 120  # and 20 kept

    memory = SimpleNamespace(synchronize=lambda device: None, memory_allocated=lambda device: counters["allocated"],
                             reset_peak_memory_stats=lambda device: counters.update(peak=counters["allocated"]),
                             max_memory_allocated=lambda device: counters["peak"])
    assert measured_peak(run, "cuda:0", memory) == 800


def test_the_gdn_decode_op_is_wrapped_where_the_series_has_it(monkeypatch):
    from vllm_luce import compat
    from vllm_luce.patches import cpu_gdn_decode_inputs

    monkeypatch.setattr(compat, "installed_series", lambda: "0.33")
    assert cpu_gdn_decode_inputs.target_in_series() == "vllm._custom_ops:fused_sigmoid_gating_delta_rule_update_cpu"
    monkeypatch.setattr(compat, "installed_series", lambda: "0.34")
    assert cpu_gdn_decode_inputs.target_in_series() == "vllm._cpu_ops:fused_sigmoid_gating_delta_rule_update_cpu"
    monkeypatch.setattr(compat, "installed_series", lambda: "0.26")
    assert cpu_gdn_decode_inputs.target_in_series() is None


def test_the_cpu_layout_probe_takes_the_ops_module_the_release_has(monkeypatch):
    import importlib.util

    from vllm_luce.kvflash import cache_layout

    has = {"vllm._cpu_ops": False}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if has.get(name) else None)
    monkeypatch.setattr("importlib.import_module", lambda name: name)
    assert cache_layout.cpu_ops() == "vllm._custom_ops"
    has["vllm._cpu_ops"] = True  # vLLM 0.34
    assert cache_layout.cpu_ops() == "vllm._cpu_ops"
