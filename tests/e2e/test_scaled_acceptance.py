"""The scaled predictable pairs (``fixtures/scaled.py``) through real vLLM on CPU, at the "tiny" shape of the
same builders and classes the GPU benchmarks run at Qwen3-8B's: config-only checkpoints with ``load_format="dummy"``.

Two checks per setting:
* exact: vLLM's counters equal ``simulate_acceptance``, the drafter's hash rule replayed on these prompts (what
  each draft proposes, what the target accepts and where the next draft is anchored), count for count;
* statistical: each slot is right independently with probability p, so vLLM accepts draft position k with
  probability p^k and a draft's accepted length A has E[A] = sum_k p^k. Requests start on disjoint token ranges,
  so every draft has its own anchor and the drafts are independent: over N drafts, position k's accepted count
  is binomial (N, p^k) and the mean of A has standard error sqrt(Var[A] / N). Each estimate must lie within 4
  standard errors (~6e-5 two-sided each, ~0.2% over the 32 checks for a random seed; simulated over seeds 0-59,
  the mean's z-score had mean 0.0-0.2 and sd 0.95-0.99, at most 3.1 in size). The seed is fixed, so the outcome
  is too: seed 0 reads z = +0.04 (p = 0.5) and -1.85 (p = 0.9) on the mean.
"""

import math

import pytest

from tests.e2e.dflash_probe import engine
from fixtures import scaled as S

pytestmark = pytest.mark.e2e
K = S.DRAFTER_SHAPES["tiny"].block_size - 1
Z = 4.0
SPACING = 250  # request i's tokens start at 16 + 250 i: disjoint ranges (prompt 8 + up to 128 tokens + K drafted)
REQUESTS = 16


@pytest.fixture(scope="module")
def scaled(fixtures_root):
    S.register_scaled_models()
    root = fixtures_root / "scaled"
    target = S.build_target(root / "tiny-target", "tiny")
    drafters = {p: S.build_drafter(root / f"tiny-accept-{p}", target, accept=p, seed=0) for p in (0.0, 0.5, 0.9)}
    return {"target": target, "plain": S.build_target(root / "tiny-plain", "tiny", predictable=False), **drafters}


def prompts(requests: int) -> list[list[int]]:
    return [[16 + SPACING * i + j for j in range(8)] for i in range(requests)]


def expected(requests: int, tokens: int) -> list[list[int]]:
    return [[p[-1] + j for j in range(1, tokens + 1)] for p in prompts(requests)]


def spec_counters(llm) -> dict:
    found = {"per_position": [0] * K}
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            found["per_position"] = [a + b for a, b in zip(found["per_position"], m.values)]
        elif m.name.startswith("vllm:spec_decode_num_"):
            key = m.name.removeprefix("vllm:spec_decode_")
            found[key] = found.get(key, 0) + int(m.value)
    return found


def assert_counts_as_simulated(stats: dict, p: float, requests: int, tokens: int) -> None:
    want = S.simulate_acceptance([q[-1] for q in prompts(requests)], tokens, accept=p, seed=0, k=K,
                                 vocab=S.SHAPES["tiny"].vocab)
    assert {key: stats[key] for key in want} == want


def run(target, drafter, *, requests: int, tokens: int, record_taps: bool = False):
    """Greedy token ids, this run's spec-decode counters and (``record_taps``) the first target features the
    drafter's context pass received (the concatenated taps of the first step)."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(target), load_format="dummy", enforce_eager=True, max_model_len=512, dtype="bfloat16",
              seed=0, disable_log_stats=False, speculative_config={"model": str(drafter), "method": "dflash"},
              additional_config={"luce": {"dflash": {"gate": False}}})
    taps = []
    if record_taps:
        drafter_model = engine(llm).model_executor.driver_worker.worker.model_runner.drafter.model
        combine = drafter_model.combine_hidden_states
        drafter_model.combine_hidden_states = lambda h: (taps.append(h.clone()), combine(h))[1]
    before = spec_counters(llm)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts(requests)],
                        SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, detokenize=False),
                        use_tqdm=False)
    after = spec_counters(llm)
    counters = {k: ([a - b for a, b in zip(v, before[k])] if k == "per_position" else v - before.get(k, 0))
                for k, v in after.items()}
    del llm
    return [list(o.outputs[0].token_ids) for o in outs], counters, taps[0] if taps else None


def test_a_never_right_drafter_is_never_accepted_and_the_taps_are_the_real_layers(scaled):
    """p = 0: nothing accepted, the target's rule holds. The features the drafter reads are the real Qwen3 layers'
    outputs: bit for bit those vLLM's own Qwen3ForCausalLM gives it (same dummy weights, same batch)."""
    out, stats, taps = run(scaled["target"], scaled[0.0], requests=4, tokens=12, record_taps=True)
    assert out == expected(4, 12)
    assert stats["num_drafts"] >= 4 * 10 and stats["num_accepted_tokens"] == 0, stats
    assert_counts_as_simulated(stats, 0.0, 4, 12)
    _, _, plain_taps = run(scaled["plain"], scaled[0.0], requests=4, tokens=2, record_taps=True)
    shape = S.SHAPES["tiny"]
    n_taps = len(S.DRAFTER_SHAPES["tiny"].target_layer_ids)
    assert taps.shape == (4 * 8, n_taps * shape.hidden)  # the prefill's 32 prompt tokens, every tap
    assert taps.abs().sum() > 0 and taps.isfinite().all()
    assert plain_taps.equal(taps)


@pytest.mark.parametrize(("p", "tokens"), [(0.5, 32), (0.9, 128)])
def test_measured_acceptance_matches_the_setting(scaled, p, tokens):
    """About 16 drafts per request (tokens / (1 + E[A])), 16 requests: N ~ 250 drafts."""
    out, stats, _ = run(scaled["target"], scaled[p], requests=REQUESTS, tokens=tokens)
    assert out == expected(REQUESTS, tokens)  # speculation is lossless: the target's rule, token for token
    assert_counts_as_simulated(stats, p, REQUESTS, tokens)  # every draft verified in full, each as the rule says
    n = stats["num_drafts"]
    assert n >= 200, stats
    want = S.expected_acceptance(p, K)
    mean = stats["num_accepted_tokens"] / n
    assert abs(mean - want["mean"]) < Z * math.sqrt(want["variance"] / n), (mean, want["mean"], n)
    for k, (accepted, rate) in enumerate(zip(stats["per_position"], want["per_position"]), start=1):
        bound = Z * math.sqrt(rate * (1 - rate) / n)
        assert abs(accepted / n - rate) < bound, (k, accepted / n, rate, bound, stats)
