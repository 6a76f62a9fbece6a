"""KVFlash's scheduler settings: each step's tokens per request fit the pool; vLLM's buffers keep their size."""

from types import SimpleNamespace

import pytest

from vllm_luce.config import LuceConfig, LuceConfigError
from vllm_luce.kvflash.install import install_kvflash
from vllm_luce.kvflash.plan import build_plan


def vllm_config(batched=16384, scheduled=None, threshold=0, spec_tokens=None, scheduler_cls=None, async_scheduling=False):
    spec = SimpleNamespace(num_speculative_tokens=spec_tokens) if spec_tokens else None
    return SimpleNamespace(speculative_config=spec, scheduler_config=SimpleNamespace(
        max_num_batched_tokens=batched, max_num_scheduled_tokens=scheduled, long_prefill_token_threshold=threshold,
        scheduler_cls=scheduler_cls, async_scheduling=async_scheduling))


def luce(pool=384):
    return LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": pool}}})


@pytest.mark.parametrize("scheduled", [None, 2048, 100])
def test_step_budget_is_capped_and_buffers_keep_their_size(scheduled):
    config, settings = vllm_config(scheduled=scheduled), luce()
    step = build_plan(settings.kvflash).pager.max_step_tokens
    assert "step <= 192 tokens" in install_kvflash(config, settings).summary and step == 192
    sched = config.scheduler_config
    assert sched.max_num_batched_tokens == 16384  # CUDA graph sizes and draft slots were laid out from it
    assert sched.max_num_scheduled_tokens == min(scheduled or 16384, step)
    assert sched.long_prefill_token_threshold == step


def test_a_pool_too_small_for_a_speculative_step_is_refused():
    with pytest.raises(LuceConfigError, match="pool_tokens: got 384"):
        install_kvflash(vllm_config(spec_tokens=200), luce())


@pytest.mark.parametrize("current,async_scheduling,installed", [
    (None, False, "vllm_luce.kvflash.scheduler.LuceKVFlashScheduler"),
    ("vllm.v1.core.sched.async_scheduler.AsyncScheduler", True, "vllm_luce.kvflash.scheduler.LuceKVFlashAsyncScheduler"),
    ("vllm_luce.schedulers.LuceGatedScheduler", False, "vllm_luce.schedulers.LuceGatedScheduler"),
])
def test_the_scheduler_class_carries_kvflashs_prompt_end_hook(current, async_scheduling, installed):
    """vLLM's own class is replaced; the DFlash gate's (which has the hook too) stays."""
    config = vllm_config(scheduler_cls=current, async_scheduling=async_scheduling)
    install_kvflash(config, luce())
    assert config.scheduler_config.scheduler_cls == installed


def test_a_users_own_scheduler_class_is_refused_naming_the_flag():
    with pytest.raises(LuceConfigError, match="--scheduler-cls my.Scheduler"):
        install_kvflash(vllm_config(scheduler_cls="my.Scheduler"), luce())


@pytest.mark.parametrize("architectures, environ, message", [
    (["LlamaForCausalLM"], {}, "architecture LlamaForCausalLM is not served by a vllm-luce executor"),
    (["Qwen3_5ForConditionalGeneration"], {"VLLM_LUCE_EXECUTORS": "off"}, "VLLM_LUCE_EXECUTORS=off"),
])
def test_an_architecture_kvflash_cannot_attach_to_stops_startup_before_the_weights(architectures, environ, message,
                                                                                   monkeypatch):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    config = vllm_config()
    config.model_config = SimpleNamespace(architectures=architectures)
    with pytest.raises(LuceConfigError, match=f"luce.kvflash: .*{message}"):
        install_kvflash(config, luce())
    monkeypatch.delenv("VLLM_LUCE_EXECUTORS", raising=False)
    config.model_config = SimpleNamespace(architectures=["Gemma4ForCausalLM"])
    assert install_kvflash(config, luce())


def test_the_install_says_as_data_whether_the_engine_clients_need_patches():
    """Paging needs the engine clients' refusal of a prompt beyond its host share; SFI (every block resident) changes
    neither the scheduler nor the clients (the VllmConfig patch reads ``engine_client``, not the summary's words)."""
    paged = install_kvflash(vllm_config(), luce())
    sfi = install_kvflash(vllm_config(), LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": 384,
                                                                                        "selection": "sfi"}}}))
    assert paged.engine_client and not sfi.engine_client and sfi.summary.startswith("SFI")
