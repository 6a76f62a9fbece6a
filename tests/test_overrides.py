"""A WARNING at startup wherever a feature overrides a vLLM setting the user could have set
(``vllm_luce/overrides.py``): the rule, every setting row of the hook table held to a warning or a reason, and each
site warning through its own install function, with no warning where the user's value already is the one set."""

import logging
from types import SimpleNamespace

import pytest

from vllm_luce import hooks, overrides
from vllm_luce.config import LuceConfig
from vllm_luce.overrides import OVERRIDES, UNWARNED


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Each test sees its warnings, even one an earlier test logged (``warn`` logs a line once per process)."""
    monkeypatch.setattr(overrides, "_warned", set())


def warnings(log) -> list[str]:
    return [r.getMessage() for r in log.records if r.levelno == logging.WARNING and " overrides " in r.getMessage()]


def test_the_message_names_flag_both_values_feature_and_the_setting_that_changes_it():
    text = overrides.message(overrides.PREFIX_CACHING, True, False)
    assert text.startswith("KVFlash overrides --enable-prefix-caching: on (yours or vLLM's default) -> off.")
    assert '{"luce": {"kvflash": false}}' in text and "prefix" in text
    text = overrides.message(overrides.DRAFT_SLOTS, 1024, 256, overrides.VLLM_DEFAULT)
    assert "--max-num-seqs: 1024 (vLLM's default; you left it unset) -> 256" in text
    assert "set --max-num-seqs or --max-num-batched-tokens" in text


@pytest.mark.parametrize("override", OVERRIDES, ids=lambda o: f"{o.feature}:{o.flag}")
def test_a_value_equal_to_the_one_set_warns_nothing(override):
    assert overrides.message(override, 192, 192) is None
    assert overrides.message(override, None, 192) is not None
    assert override.flag.startswith("--") and override.feature and override.why and override.control


def test_warn_logs_once_per_process(luce_log):
    for _ in range(3):
        assert overrides.warn(overrides.STEP_BUDGET, 8192, 192)
    assert overrides.warn(overrides.STEP_BUDGET, 192, 192) is None
    assert len(warnings(luce_log)) == 1


def test_every_setting_row_of_the_hook_table_warns_or_says_why_not():
    settings = {h.target for h in hooks.HOOKS if h.kind in (hooks.SETTING, hooks.CLASS_PATH)}
    warned = {o.target for o in OVERRIDES}
    assert settings <= warned | set(UNWARNED), settings - warned - set(UNWARNED)
    assert not warned & set(UNWARNED)
    known = {h.target for h in hooks.HOOKS}
    assert warned | set(UNWARNED) <= known, (warned | set(UNWARNED)) - known


def kvflash(pool=384):
    return LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": pool}}})


def scheduler_config(scheduled=None, threshold=0, scheduler_cls=None):
    return SimpleNamespace(max_num_batched_tokens=16384, max_num_scheduled_tokens=scheduled,
                           long_prefill_token_threshold=threshold, scheduler_cls=scheduler_cls, async_scheduling=False)


@pytest.mark.parametrize("asked, expected", [
    (True, ["--enable-prefix-caching: on (yours or vLLM's default) -> off"]),
    (None, ["--enable-prefix-caching: on (vLLM's default; you left it unset) -> off"]),
    (False, []),
])
def test_kvflash_warns_that_prefix_caching_goes_off(luce_log, asked, expected):
    from vllm_luce.kvflash.install import before_vllm_checks

    config = SimpleNamespace(cache_config=SimpleNamespace(enable_prefix_caching=asked))
    before_vllm_checks(config, kvflash())
    assert config.cache_config.enable_prefix_caching is False
    lines = warnings(luce_log)
    assert len(lines) == len(expected) and all(e in w for e, w in zip(expected, lines)), lines


def test_kvflash_warns_of_the_step_budget_its_threshold_and_scheduler_class(luce_log):
    from vllm_luce.kvflash.install import install_kvflash

    install_kvflash(SimpleNamespace(speculative_config=None, scheduler_config=scheduler_config()), kvflash())
    lines = warnings(luce_log)
    assert any("--max-num-scheduled-tokens: 16384 (yours or vLLM's default) -> 192" in w for w in lines), lines
    assert any("--long-prefill-token-threshold: 0 (no cap) (yours or vLLM's default) -> 192" in w for w in lines)
    assert any("KVFlash overrides --scheduler-cls" in w and "LuceKVFlashScheduler" in w for w in lines)
    assert len(lines) == 3


def test_kvflash_warns_nothing_where_the_users_values_already_fit(luce_log):
    from vllm_luce.kvflash.install import install_kvflash

    sched = scheduler_config(scheduled=100, threshold=150,
                             scheduler_cls="vllm_luce.kvflash.scheduler.LuceKVFlashScheduler")
    install_kvflash(SimpleNamespace(speculative_config=None, scheduler_config=sched), kvflash())
    assert sched.max_num_scheduled_tokens == 100 and sched.long_prefill_token_threshold == 150
    assert warnings(luce_log) == []


def gate_config(v2=False, scheduler_cls=None):
    spec = SimpleNamespace(method="dflash", num_speculative_tokens=15, num_speculative_tokens_per_batch_size=None)
    return SimpleNamespace(speculative_config=spec, use_v2_model_runner=v2,
                           scheduler_config=SimpleNamespace(max_num_seqs=128, scheduler_cls=scheduler_cls,
                                                            async_scheduling=True),
                           parallel_config=SimpleNamespace(data_parallel_size=1))


def test_the_dflash_gate_warns_of_its_scheduler_class_and_on_v2_with_cuda_its_table(luce_log, monkeypatch):
    import vllm.platforms

    from vllm_luce.spec_decode.install import install_gate

    install_gate(gate_config(), LuceConfig.from_sources({}, {}))
    assert [w for w in warnings(luce_log) if "DFlash gate overrides --scheduler-cls: unset (vLLM's default) -> " in w]
    monkeypatch.setattr(vllm.platforms, "current_platform", SimpleNamespace(is_cuda=lambda: True))
    install_gate(gate_config(v2=True), LuceConfig.from_sources({}, {}))
    table = [w for w in warnings(luce_log) if "--speculative-config num_speculative_tokens_per_batch_size" in w]
    assert len(table) == 1 and "unset (vLLM's default) -> [(" in table[0]


def test_the_dflash_gate_warns_nothing_replacing_kvflashs_class(luce_log):
    from vllm_luce.spec_decode.install import install_gate

    config = gate_config(scheduler_cls="vllm_luce.kvflash.scheduler.LuceKVFlashAsyncScheduler")
    assert install_gate(config, LuceConfig.from_sources({}, {})).summary.endswith("LuceGatedAsyncScheduler")
    assert warnings(luce_log) == []


class EngineArgs:
    """What fit_draft_slots reads, with vLLM's H100-class defaults (8192 tokens and 1024 requests for serve)."""
    tensor_parallel_size = pipeline_parallel_size = 1

    def __init__(self, max_num_seqs=None):
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, None

    def get_batch_defaults(self, world_size):
        return {"llm": 16384, "serve": 8192}, {"llm": 1024, "serve": 1024}


def test_dflash_warns_when_it_lowers_vllms_default_max_num_seqs(luce_log):
    from vllm_luce.patches.engine_args import fit_draft_slots

    assert fit_draft_slots(EngineArgs(), 15) == (256, 14)
    assert [w for w in warnings(luce_log) if "--max-num-seqs: 1024 (vLLM's default; you left it unset) -> 256" in w]
    assert fit_draft_slots(EngineArgs(max_num_seqs=1024), 15) is None  # the user's choice stays
    assert len(warnings(luce_log)) == 1


@pytest.mark.parametrize("current, warned", [("", True), (None, True), ("EXTENSION", False)])
def test_pflash_warns_that_it_sets_the_worker_extension(luce_log, current, warned):
    from vllm_luce.pflash.install import _install_worker_extension
    from vllm_luce.pflash.worker import EXTENSION

    parallel = SimpleNamespace(worker_extension_cls=EXTENSION if current == "EXTENSION" else current)
    _install_worker_extension(SimpleNamespace(parallel_config=parallel))
    assert parallel.worker_extension_cls == EXTENSION
    lines = warnings(luce_log)
    assert len(lines) == int(warned)
    assert all("PFlash overrides --worker-extension-cls: unset (vLLM's default) -> " in w for w in lines)
