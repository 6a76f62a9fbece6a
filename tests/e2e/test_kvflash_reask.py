"""KVFlash through vLLM on CPU with the trained fixture: a needle asked for, evicted by the conversation's later
reselections, then asked for again must come back from host (issue 41's "evicted earlier" case,
``fixtures/reask.py``). Each conversation is one request whose continuation is scripted
(``fixtures/forced.py``): ask A, ask 3 other needles, read 384+ tokens of code, ask A again.

The default policy must have brought A's chunk in at the prompt's end, lost it before the re-ask in some cases,
and answered those re-asks; LRU, which never pages anything back in, must answer none of them (the case can
fail)."""

import pytest

from fixtures import reask as R
from fixtures.trained_llm import build_llm
from vllm_luce.config import SCHEMA

POOL, TOKENS = 512, 2048


@pytest.fixture(scope="module")
def cases():
    from transformers import AutoTokenizer

    from fixtures.trained import trained_model

    tokenizer = AutoTokenizer.from_pretrained(str(trained_model("tokenizer")))
    return R.make_cases(tokenizer, TOKENS, range(2), POOL)  # 5 depths x 2 seeds


def reask(policy, cases) -> dict:
    from fixtures.forced import ForcedTokens

    llm = build_llm(TOKENS + 1024, additional_config={"luce": {"kvflash": {"pool_tokens": POOL, "policy": policy}}},
                      logits_processors=[ForcedTokens])
    try:
        return R.reask_accuracy(llm, cases)
    finally:
        del llm


def test_the_default_policy_pages_an_evicted_needle_back_in_when_it_is_asked_for_again(cases):
    got = reask(SCHEMA["kvflash"]["policy"].default, cases)
    # measured (docs/fidelity.md): 9 selected, 9 evicted, 7 of those re-asks answered; full KV answers all 10
    assert got["aligned"] == got["cases"] == 10, got  # every question's step reselected, as scripted
    assert got["selected"] >= 8, got  # the prompt's end brought A's chunk in
    assert got["evicted"] >= 5, got  # the conversation moved on: A's chunks left the pool
    assert got["again_when_evicted"] >= 0.6 * got["evicted"], got  # and came back when asked for


def test_lru_answers_no_reask_whose_chunk_was_evicted(cases):
    got = reask("lru", cases)
    assert got["aligned"] == got["cases"] and got["evicted"] >= 8, got
    assert got["again_when_evicted"] == 0, got
