"""DFlash on a predictable target (next token = token + 1) with drafters that are always right or
always wrong, through real vLLM (CPU, V1 runner). Acceptance is read from vLLM's spec metrics."""

import pytest

from fixtures import predictable as P
from vllm_luce.spec_decode.gate_report import summary

pytestmark = pytest.mark.e2e
K = 15
PROMPT = list(range(100, 110))


@pytest.fixture(scope="module")
def pair(fixtures_root):
    P.register_predictable_drafter()
    target = P.build_target(fixtures_root / "predictable-target")
    return target, {"right": P.build_drafter(target, fixtures_root / "predictable-right", offset=0),
                    "wrong": P.build_drafter(target, fixtures_root / "predictable-wrong", offset=P.WRONG_OFFSET)}


def run(target, drafter, *, gate, requests=4, tokens=64, xargs=None):
    """``xargs``: each request's vllm_xargs (SamplingParams.extra_args), or None for none."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(target), speculative_config={"model": str(drafter), "method": "dflash"}, enforce_eager=True,
              max_model_len=512,
              dtype="bfloat16", seed=0, disable_log_stats=False,
              additional_config={"luce": {"dflash": {"gate": gate}}})
    prompts = [{"prompt_token_ids": [t + 50 * i for t in PROMPT]} for i in range(requests)]
    params = [SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, extra_args=x)
              for x in (xargs or [None] * requests)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    m = {x.name: x for x in llm.get_metrics()}
    stats = {k: int(m[f"vllm:spec_decode_{k}"].value) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    gate = getattr(scheduler, "luce_gate", None)
    result = ([list(o.outputs[0].token_ids) for o in outs], stats, gate)
    del llm
    return result


def expected(requests, tokens, vocab=1024):
    return [[(PROMPT[-1] + 50 * i + j) % vocab for j in range(1, tokens + 1)] for i in range(requests)]


def test_always_right_drafter_is_always_accepted(pair):
    target, drafters = pair
    out, stats, _ = run(target, drafters["right"], gate=False)
    assert out == expected(4, 64)
    assert stats["num_drafts"] > 0 and stats["num_draft_tokens"] == K * stats["num_drafts"]
    # Acceptance length equals the verified width: every verified draft is accepted.
    assert stats["num_accepted_tokens"] == stats["num_draft_tokens"], stats


def test_always_wrong_drafter_is_never_accepted_and_output_is_unchanged(pair):
    target, drafters = pair
    out, stats, _ = run(target, drafters["wrong"], gate=False)
    assert out == expected(4, 64)
    assert stats["num_draft_tokens"] > 0 and stats["num_accepted_tokens"] == 0, stats


def test_gate_stops_verifying_a_drafter_that_never_pays(pair):
    target, drafters = pair
    out, stats, gate = run(target, drafters["wrong"], gate=True, requests=4, tokens=200)
    assert out == expected(4, 200)
    ungated_drafts = 200 - 1  # one draft per step per request without the gate
    assert stats["num_drafts"] < 0.5 * 4 * ungated_drafts, (stats, summary(gate))


def test_a_request_can_decline_speculation_while_the_others_speculate(pair):
    """vllm_xargs luce_dflash off: with the always-right drafter, every accepted draft belongs to the requests that
    did not decline (at most tokens - 1 each), and the output is unchanged; declined alone, nothing is drafted."""
    from vllm import LLM, SamplingParams

    target, drafters = pair
    off = {"luce_dflash": "off"}
    out, stats, gate = run(target, drafters["right"], gate=True, tokens=64, xargs=[off, None, off, {"luce_dflash": "on"}])
    assert out == expected(4, 64)
    assert 0 < stats["num_accepted_tokens"] == stats["num_draft_tokens"] <= 2 * 63, (stats, summary(gate))
    assert stats["num_accepted_tokens"] > 63  # both speculating requests used drafts
    assert gate.declined == set()  # released when the requests finished
    out, stats, _ = run(target, drafters["right"], gate=True, requests=2, tokens=32, xargs=[off, off])
    assert out == expected(2, 32) and stats["num_drafts"] == 0, stats
    llm = LLM(model=str(target), speculative_config={"model": str(drafters["right"]), "method": "dflash"},
              enforce_eager=True, max_model_len=512, dtype="bfloat16")
    with pytest.raises(ValueError, match='vllm_xargs.luce_dflash: got .of.; expected "on" or "off"'):
        llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=4, extra_args={"luce_dflash": "of"}))
    assert llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=4))[0].outputs[0].token_ids
    del llm


def test_gate_speculates_with_a_drafter_that_is_always_right(pair):
    """The gated engine measures both modes and then speculates on nearly every step; output is the target's."""
    target, drafters = pair
    out, stats, gate = run(target, drafters["right"], gate=True, requests=4, tokens=200)
    assert out == expected(4, 200)
    assert gate.decisions["spec"] > 2 * gate.decisions["plain"], summary(gate)
    assert stats["num_accepted_tokens"] == stats["num_draft_tokens"] > 0, stats
