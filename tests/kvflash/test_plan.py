"""KVFlash's plan: one pure function of the resolved settings and the speculation, the same in every process."""

from types import SimpleNamespace

import pytest

from vllm_luce.config import LuceConfig
from vllm_luce.kvflash.pager import KVFlashConfigError
from vllm_luce.kvflash.plan import build_plan, plan_of


def settings(**kvflash):
    return LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": 384, **kvflash}}}, {})


def vllm_config(luce, spec_tokens=None):
    spec = SimpleNamespace(num_speculative_tokens=spec_tokens) if spec_tokens else None
    config = SimpleNamespace(additional_config={}, speculative_config=spec)
    luce.attach(config)
    return config


def test_every_process_derives_the_parsing_process_plan_from_the_attached_settings():
    """The workers and the engine core read the LuceConfig attached to the VllmConfig, not their own environment."""
    first = settings(selection="sfi", policy="attention", query_window=4)
    config = vllm_config(first, spec_tokens=7)
    plan = plan_of(first, config)
    assert plan_of(LuceConfig.from_vllm_config(config), config) == plan
    assert plan.sfi and not plan.pages and plan.resident_cap_tokens == 0
    assert (plan.pager.pool_tokens, plan.policy, plan.query_window, plan.draft_tokens) == (384, "attention", 4, 7)


def test_a_paged_plan_caps_residency_at_the_pool_and_names_the_scorer():
    plan = build_plan(settings(policy="scorer").kvflash)
    assert plan.pages and not plan.sfi and plan.scorer and plan.resident_cap_tokens == 384


@pytest.mark.parametrize("kvflash,drafts,message", [
    ({"pool_tokens": 100}, 0, "pool_tokens: got 100; expected a positive multiple"),
    ({"policy": "attention"}, 0, "policy: got 'attention'; it reads every chunk's keys"),
    ({}, 200, "pool_tokens: got 384; a step writes up to 201 tokens"),
])
def test_a_plan_that_cannot_run_names_the_setting(kvflash, drafts, message):
    with pytest.raises(KVFlashConfigError, match=message):
        build_plan(settings(**kvflash).kvflash, drafts)
    assert build_plan(settings(**{**kvflash, "selection": "sfi", "pool_tokens": 384}).kvflash, drafts).sfi
