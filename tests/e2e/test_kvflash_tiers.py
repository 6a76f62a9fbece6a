"""KVFlash's tiers through real vLLM (CPU, V1 runner): cold chunks go to vLLM's free KV blocks first and host memory
takes the rest, within a budget the host shares; a request whose page-outs would not fit waits (nothing is dropped),
and a prompt beyond one request's share is refused with an error naming the setting."""

import hashlib
import json

import pytest

from tests.e2e.dflash_probe import engine
from fixtures.serve_load import TIE_NATS
from tests.e2e.test_kvflash import blocks_held, greedy, kvflash, kvflash_manager, make_llm, prompt, runtime
from vllm_luce.kvflash.policies import Scorer
from vllm_luce.metrics import STORE

PROMPTS = (3000, 2500, 2000)
GEN = 64
POOL = 1024  # 16 chunks, 11 of them evictable: a reselection can swap several


def hashed_scores(pager, chunks):
    """Scores that swap chunks at every reselection, the same in every engine (a function of the chunk and the
    request's length): two engines that keep the same bytes then produce the same tokens."""
    import torch

    return torch.tensor([int(hashlib.sha256(f"{c}-{pager.num_tokens}".encode()).hexdigest()[:8], 16) / 2**32
                         for c in chunks])


def chunk_bytes(model) -> int:
    """One 64-token chunk of the model's full-attention layers' K and V in bf16 (what a page-out copies)."""
    config = json.loads((model / "config.json").read_text())
    layers = config["layer_types"].count("full_attention")
    return layers * 64 * config["num_key_value_heads"] * 2 * config["head_dim"] * 2


@pytest.fixture(scope="module")
def qwen(tiny_model):
    return tiny_model("qwen3_6")


def greedy_with_gaps(llm, prompts) -> tuple[list[list[int]], list[list[float]]]:
    """Greedy tokens, and at each position the gap in nats between the top two tokens."""
    from vllm import SamplingParams

    outs = llm.generate(prompts, SamplingParams(max_tokens=GEN, temperature=0, ignore_eos=True, logprobs=2),
                        use_tqdm=False)
    gaps = []
    for out in outs:
        tops = [sorted((lp.logprob for lp in step.values()), reverse=True) for step in out.outputs[0].logprobs]
        gaps.append([top[0] - top[1] if len(top) > 1 else float("inf") for top in tops])
    return [list(o.outputs[0].token_ids) for o in outs], gaps


def first_differences_beyond_a_near_tie(tokens, reference, gaps) -> list[str]:
    """Requests whose tokens differ from the reference's first where the reference's top two are more than
    ``TIE_NATS`` apart. Within a near-tie either token is greedy: a batch of another composition rounds bf16
    otherwise (on an AVX512-BF16 host a request run after the others flips a 0.004-nat tie)."""
    bad = []
    for i, (got, want, gap) in enumerate(zip(tokens, reference, gaps)):
        at = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if len(got) != len(want) or (at is not None and gap[at] > TIE_NATS):
            where = "-" if at is None else f"{gap[at]:.4f}"
            bad.append(f"request {i}: {len(got)} tokens, first difference at {at} (top-2 gap {where} nats)")
    return bad


@pytest.fixture(scope="module")
def host_tier(qwen):
    """Cold chunks in host memory only, every reselection swapping: the reference tokens, their top-2 gaps and
    paging."""
    llm = make_llm(qwen, kvflash(POOL, gpu_cold=False))
    runtime(llm).policy = Scorer(hashed_scores)
    prompts = [prompt(n, i) for i, n in enumerate(PROMPTS)]
    (tokens, gaps), stats = greedy_with_gaps(llm, prompts), runtime(llm).stats()
    del llm
    return prompts, tokens, stats, gaps


def test_cold_chunks_live_in_free_kv_blocks_and_give_the_host_tiers_tokens(qwen, host_tier):
    prompts, reference, host_stats, _ = host_tier
    llm = make_llm(qwen, kvflash(POOL))
    runtime(llm).policy = Scorer(hashed_scores)
    pool = kvflash_manager(llm).block_pool
    free_before = pool.get_num_free_blocks()
    with blocks_held(llm) as held:
        tokens = greedy(llm, prompts, gen=GEN)
    stats = runtime(llm).stats()
    assert tokens == reference  # the same bytes back from the cold blocks as from host memory, at every swap
    assert host_stats["page_ins"] > 10 and stats["page_ins"] == host_stats["page_ins"]  # swaps both ways
    assert stats["cold_outs"] == stats["page_outs"] == host_stats["page_outs"] and stats["bytes_out"] == 0
    assert max(held) > kvflash_manager(llm).kv_cache_spec.pool_blocks  # blocks lent beyond the pool
    assert pool.get_num_free_blocks() == free_before  # and given back with the requests
    assert kvflash_manager(llm).luce_admission.total() == 0
    del llm


def test_a_host_budget_smaller_than_the_load_holds_requests_back_and_drops_nothing(qwen, host_tier, tmp_path):
    """Three long prompts whose page-outs (up to 32, 25 and 17 chunks) exceed a budget of 40 chunks: each waits until
    host memory frees, the host never holds more than the budget, nothing is dropped, and the tokens are those of the
    unbounded run up to a near-tie (a request held back runs in other batches)."""
    from vllm import SamplingParams

    prompts, reference, _, gaps = host_tier
    budget = 40 * chunk_bytes(qwen)
    llm = make_llm(qwen, kvflash(POOL, gpu_cold=False, host_bytes=budget, host_request_bytes=budget,
                                 host_ledger=str(tmp_path / "ledger")))
    runtime(llm).policy = Scorer(hashed_scores)
    admission = kvflash_manager(llm).luce_admission
    ledger, hold, peak = admission.ledger, admission.ledger.hold_up_to, [0]

    def watched(kind, nbytes, engine=0, partial=True):  # every change the admission makes to the ledger
        granted = hold(kind, nbytes, engine, partial)
        peak[0] = max(peak[0], ledger.held())
        return granted

    ledger.hold_up_to = watched
    assert first_differences_beyond_a_near_tie(greedy(llm, prompts, gen=GEN), reference, gaps) == []
    stats = runtime(llm).stats()
    assert 0 < peak[0] <= budget and stats["bytes_out"] > budget
    assert stats["lost"] == 0 and stats["host_over_reserved"] == 0  # every chunk placed, within its reservation
    llm.llm_engine.step()  # the step that tells the worker which requests finished (a server's loop runs it at once)
    assert runtime(llm).host_bytes() == 0 and ledger.held() == 0  # every reservation and page came back
    held_back = sum(v for (name, _), v in STORE.values["counter"].items() if name == "kvflash_held_back_steps")
    assert held_back > 0

    # One request's share here is the whole budget: 16 pool chunks + 40 = 3584 tokens of context.
    with pytest.raises(ValueError, match=r"luce\.kvflash\.host_request_bytes: this prompt of 3600 tokens"):
        greedy(llm, [prompt(3600, 9)], gen=2)
    out = llm.generate([prompt(3500, 10)], SamplingParams(max_tokens=500, temperature=0, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 3584 - 3500 and out.finish_reason == "length"  # stopped where its share ends
    assert engine(llm).scheduler.requests == {} and ledger.held() == 0
    del llm
