"""Every ``outcome`` label of ``pflash_prompts`` comes from the catalog's fixed set: the skip reasons the code gives
map onto their own values, anything else (``luce_pflash_skip`` from a client) onto ``skipped_other``."""

from types import SimpleNamespace

import pytest

from vllm_luce.metrics.catalog import CATALOG, PFLASH_OUTCOMES
from vllm_luce.patches.chat_completion_request import skip_reason as chat_skip_reason
from vllm_luce.pflash import frontend

TOKENS = {"type": "token", "prompt_token_ids": list(range(100))}


def params(**kw):
    return SimpleNamespace(**{"structured_outputs": None, "prompt_logprobs": None, "extra_args": None, **kw})


CHAT = dict(tools=None, tool_choice=None, response_format=None)
CASES = [
    (lambda: frontend.skip_reason(TOKENS, object(), 10), "skipped_not_a_generation_request"),
    (lambda: frontend.skip_reason({"type": "embeds"}, params(), 10), "skipped_not_a_token_prompt"),
    (lambda: frontend.skip_reason(TOKENS, params(extra_args={"luce_pflash": "off"}), 10), "skipped_opted_out"),
    (lambda: frontend.skip_reason(TOKENS, params(structured_outputs=object()), 10), "skipped_response_format"),
    (lambda: frontend.skip_reason(TOKENS, params(prompt_logprobs=1), 10), "skipped_prompt_logprobs"),
    (lambda: frontend.skip_reason(TOKENS, params(), 1000), "skipped_short_prompt"),
    (lambda: chat_skip_reason(SimpleNamespace(**{**CHAT, "tools": [{}]})), "skipped_tools"),
    (lambda: chat_skip_reason(SimpleNamespace(**{**CHAT, "tool_choice": "required"})), "skipped_tool_choice"),
    (lambda: chat_skip_reason(SimpleNamespace(**{**CHAT, "response_format": SimpleNamespace(type="json_object")})),
     "skipped_response_format"),
    (lambda: "a value a client sent", "skipped_other"),
]


@pytest.mark.parametrize("reason,outcome", CASES, ids=[o for _, o in CASES])
def test_each_skip_reason_has_its_outcome_in_the_fixed_set(reason, outcome):
    assert frontend.skip_outcome(reason()) == outcome and outcome in PFLASH_OUTCOMES


def test_an_outcome_outside_the_set_is_refused():
    with pytest.raises(ValueError, match="outcome 'skipped_x' is not one of"):
        frontend.count(SimpleNamespace(vllm_config=None), "skipped_x")


def test_the_catalog_help_names_every_outcome():
    meaning = CATALOG["pflash_prompts"][2]
    assert all(o.removeprefix("skipped_") in meaning for o in PFLASH_OUTCOMES)
