"""KVFlash's scheduler settings: each step's tokens per request fit the pool; vLLM's buffers keep their size."""

from types import SimpleNamespace

import pytest

from vllm_luce.config import LuceConfig, LuceConfigError
from vllm_luce.kvflash.install import install_kvflash
from vllm_luce.kvflash.settings import pager_config_from


def vllm_config(batched=16384, scheduled=None, threshold=0, spec_tokens=None):
    spec = SimpleNamespace(num_speculative_tokens=spec_tokens) if spec_tokens else None
    return SimpleNamespace(speculative_config=spec, scheduler_config=SimpleNamespace(
        max_num_batched_tokens=batched, max_num_scheduled_tokens=scheduled, long_prefill_token_threshold=threshold))


def luce(pool=384):
    return LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": pool}}})


@pytest.mark.parametrize("scheduled", [None, 2048, 100])
def test_step_budget_is_capped_and_buffers_keep_their_size(scheduled):
    config, settings = vllm_config(scheduled=scheduled), luce()
    step = pager_config_from(settings.kvflash).max_step_tokens
    assert "step <= 192 tokens" in install_kvflash(config, settings) and step == 192
    sched = config.scheduler_config
    assert sched.max_num_batched_tokens == 16384  # CUDA graph sizes and draft slots were laid out from it
    assert sched.max_num_scheduled_tokens == min(scheduled or 16384, step)
    assert sched.long_prefill_token_threshold == step


def test_a_pool_too_small_for_a_speculative_step_is_refused():
    with pytest.raises(LuceConfigError, match="pool_tokens: got 384"):
        install_kvflash(vllm_config(spec_tokens=200), luce())
