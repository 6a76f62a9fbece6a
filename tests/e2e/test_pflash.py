"""PFlash through real vLLM (in-process LLM, V1 runner on CPU), with the trained target and scorer.

One engine at a time: the PFlash-off reference first, then keep 1.0, then the compressing engine,
then a cross-tokenizer engine whose drafter is the tiny random Qwen3 (another tokenizer).
"""

from __future__ import annotations

import gc

import pytest

from fixtures import needle as N
from fixtures.trained import heldout_files, trained_model

pytestmark = pytest.mark.e2e

MAX_LEN = 4096
KEEP = 0.2


def _llm(pflash: dict | None):
    from fixtures import trained_llm as F

    if pflash is None:
        return F.build_llm(MAX_LEN)
    settings = {"drafter": str(trained_model("scorer")), "min_prompt_tokens": 512, **pflash}
    return F.build_llm(MAX_LEN, additional_config={"luce": {"pflash": settings}})


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(trained_model("tokenizer")))


@pytest.fixture(scope="module")
def cases(tokenizer):
    return N.make_cases(tokenizer, list(heldout_files()), tokens=2048, depths=(0.1, 0.5, 0.9), seeds=range(2))


def _prompts(tokenizer, cases):
    return [{"prompt_token_ids": tokenizer.encode(c.prompt, add_special_tokens=False)} for c in cases]


def _greedy(n=8, **kw):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0, **kw)


@pytest.fixture(scope="module")
def runs(tokenizer, cases):
    """Outputs of each engine over the same needle prompts (engines built one after another)."""
    out = {}
    for name, pflash in (("off", None), ("keep1", {"keep_ratio": 1.0}), ("keep", {"keep_ratio": KEEP})):
        llm = _llm(pflash)
        out[name] = llm.generate(_prompts(tokenizer, cases), _greedy())
        if name == "keep":
            out["keep_opt_out"] = llm.generate(_prompts(tokenizer, cases[:2]),
                                               _greedy(extra_args={"luce_pflash": "off"}))
            out["keep_short"] = llm.generate([{"prompt_token_ids": _prompts(tokenizer, cases)[0]["prompt_token_ids"][:400]}],
                                             _greedy())
            out["keep_logprobs"] = llm.generate(_prompts(tokenizer, cases[:1]), _greedy(prompt_logprobs=0))
            from vllm.sampling_params import StructuredOutputsParams

            out["keep_structured"] = llm.generate(
                _prompts(tokenizer, cases[:1]), _greedy(structured_outputs=StructuredOutputsParams(regex="[0-9]{6}")))
        del llm
        gc.collect()
    return out


def test_keep_ratio_one_is_identical_to_pflash_off(runs):
    for off, on in zip(runs["off"], runs["keep1"]):
        assert on.prompt_token_ids == off.prompt_token_ids
        assert on.outputs[0].token_ids == off.outputs[0].token_ids


def test_compression_keeps_the_configured_share_and_the_needle(runs, cases):
    for case, off, on in zip(cases, runs["off"], runs["keep"]):
        full, kept = len(off.prompt_token_ids), len(on.prompt_token_ids)
        budget = int(-(-full // 32) * KEEP) * 32
        assert kept < full and kept <= 2 * budget, (full, kept)  # anchors may add up to the budget again
        assert on.outputs[0].text.startswith(case.answer), (case.depth, on.outputs[0].text)


def test_opted_out_short_logprob_and_structured_requests_are_not_compressed(runs):
    for off, out in zip(runs["off"], runs["keep_opt_out"]):
        assert out.prompt_token_ids == off.prompt_token_ids and out.outputs[0].token_ids == off.outputs[0].token_ids
    assert len(runs["keep_short"][0].prompt_token_ids) == 400
    for name in ("keep_logprobs", "keep_structured"):
        assert runs[name][0].prompt_token_ids == runs["off"][0].prompt_token_ids, name


def test_cross_tokenizer_drafter_maps_kept_text_back(tokenizer, cases, tiny_model):
    """The tiny random Qwen3 has another tokenizer: kept drafter spans go back through text at word
    boundaries. Its scores are noise, so the needle survives through the lexical anchors."""
    llm = _llm({"keep_ratio": KEEP, "drafter": str(tiny_model("qwen3"))})
    try:
        outs = llm.generate(_prompts(tokenizer, cases[:3]), _greedy())
    finally:
        del llm
        gc.collect()
    for case, out in zip(cases, outs):
        assert len(out.prompt_token_ids) < case.prompt_tokens * 0.6
        text = tokenizer.decode(out.prompt_token_ids)
        assert text.endswith(case.prompt[-40:]) and f'= "{case.answer}"' in text


def test_kvflash_drafter_scorer_policy_uses_the_pflash_scorer(tokenizer, cases):
    """KVFlash with policy 'scorer' (pool 512 for 2K prompts): PFlash's drafter scores the chunks that
    stay resident. Compression is off here (min_prompt_tokens above the prompts) to isolate the policy."""
    from fixtures import trained_llm as F

    llm = F.build_llm(MAX_LEN, additional_config={"luce": {
        "kvflash": {"pool_tokens": 512, "policy": "scorer"},
        "pflash": {"drafter": str(trained_model("scorer")), "min_prompt_tokens": 100_000}}})
    try:
        outs = llm.generate(_prompts(tokenizer, cases[:3]), _greedy())
        runtime = F.engine_runner(llm).luce_kvflash
        stats, passes = runtime.stats(), runtime.policy.score_chunks.passes
    finally:
        del llm
        gc.collect()
    assert all(len(o.prompt_token_ids) == c.prompt_tokens for c, o in zip(cases, outs))  # not compressed
    assert all(len(o.outputs[0].token_ids) == 8 for o in outs)
    assert runtime.policy.name == "scorer" and passes >= 3, passes
    assert stats["page_outs"] > 0 and stats["reselections"] > 0, stats


def test_pflash_composes_with_dflash_and_kvflash(tokenizer, cases):
    """All three features on one engine (trained DFlash drafter, a 1024-token pool, keep 0.2): prompts
    are compressed, speculation runs on the compressed prompt over the pool, and the needles come back."""
    from fixtures import trained_llm as F

    llm = F.build_llm(MAX_LEN, drafter=trained_model("qwen36-dflash"), num_spec=7, disable_log_stats=False,
                      additional_config={"luce": {
        "kvflash": {"pool_tokens": 1024},
        "pflash": {"drafter": str(trained_model("scorer")), "keep_ratio": KEEP, "min_prompt_tokens": 512}}})
    try:
        outs = llm.generate(_prompts(tokenizer, cases[:3]), _greedy())
        pooled = F.engine_runner(llm).luce_kvflash is not None
        metrics = {m.name: m for m in llm.get_metrics()}
        drafts = int(metrics["vllm:spec_decode_num_drafts"].value)
    finally:
        del llm
        gc.collect()
    for case, out in zip(cases, outs):
        assert len(out.prompt_token_ids) < 0.6 * case.prompt_tokens
        assert out.outputs[0].text.startswith(case.answer), out.outputs[0].text
    assert pooled and drafts > 0
