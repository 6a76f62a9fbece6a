"""The engine client's side of KVFlash's host share: a prompt that could never fit is refused naming the setting, and
the children of a request for n samples split one share (the engine reads ``FAMILY``; test_admission.py)."""

from types import SimpleNamespace

import pytest

from vllm_luce.kvflash import frontend as F

CHUNK = 64
# a pool of 8 chunks, a share of 9 chunks of 1000 bytes, 15 lookahead tokens, as engine_tiers publishes them
FACTS = {"pool_chunks": 8, "chunk_tokens": CHUNK, "chunk_bytes": 1000, "request_bytes": 9000, "margin": 15 + CHUNK,
         "pool_tokens": 8 * CHUNK, "budget": 10**6, "waits": True}
LONGEST = (8 + 9) * CHUNK - 15 - CHUNK  # refused: a prompt of this many tokens alone


def params(n=1, extra=None):
    return SimpleNamespace(n=n, max_tokens=16, extra_args=extra)


@pytest.fixture
def engine(monkeypatch):
    monkeypatch.setattr("vllm_luce.kvflash.engine_tiers.read_facts", lambda vllm_config: FACTS)
    return SimpleNamespace(vllm_config=object())


def prompt(tokens):
    return {"prompt_token_ids": list(range(tokens))}


def test_a_request_for_n_samples_is_marked_and_its_prompt_checked_against_a_share_split_n_ways(engine):
    F.check(engine, prompt(LONGEST - 1), params())  # the longest a request alone may send
    one = params(n=3, extra={"luce_dflash": "off"})
    F.check(engine, prompt((8 + 3) * CHUNK - 15 - CHUNK - 1), one)
    assert one.extra_args == {"luce_dflash": "off", F.FAMILY: 3} and F.family_of(one) == 3
    with pytest.raises(ValueError, match=r"luce\.kvflash\.host_request_bytes: .*3000 bytes, split between the "
                                         r"request's n=3 samples"):
        F.check(engine, prompt((8 + 3) * CHUNK - 15 - CHUNK), params(n=3))
    with pytest.raises(ValueError, match="host_request_bytes"):
        F.check(engine, prompt(LONGEST), params())


def test_the_family_is_the_servers_word_never_the_clients(engine):
    sneaky = params(n=4, extra={F.FAMILY: 1})  # a client may not claim a whole share for each of its samples
    F.check(engine, prompt(10), sneaky)
    assert F.family_of(sneaky) == 4
    alone = params(n=1, extra={F.FAMILY: 8, "luce_pflash": "off"})
    F.check(engine, prompt(10), alone)
    assert alone.extra_args == {"luce_pflash": "off"} and F.family_of(alone) == 1
    assert F.family_of(params(extra={F.FAMILY: "2"})) == 1 and F.family_of(SimpleNamespace()) == 1
