"""KVFlash on the GPU through vLLM's defaults: a pool covering the context gives vLLM's tokens; a prompt 8x
the pool completes while the scheduler holds at most the pool's blocks; paging is bit-exact in vLLM's
cache; on both model runners (the tiny Laguna: 3 sliding + 1 pooled full-attention layer)."""

import random

import pytest

from tests.gpu.conftest import RUNNERS, TP, llm_args, run_engine

POOL = 384  # 6 chunks of 64: the floor (1 sink + 4 recent + 1); 8x the pool fits the tiny models' 4096


def prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(5, 1000) for _ in range(n)]


def spec(model, prompts, pool=None, **extra):
    luce = {"luce": {"kvflash": {"pool_tokens": pool}}} if pool else {}
    return {"model": str(model), "prompts": prompts, "max_tokens": 32, "rpc": ["kvflash"],
            "llm": llm_args(max_model_len=4096, dtype="bfloat16", additional_config=luce), **extra}


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_pool_covering_the_context_gives_vllms_tokens(tiny_model, tmp_path, runner):
    model, prompts = tiny_model("laguna"), [prompt(100, 1), prompt(250, 2), prompt(POOL - 40, 3)]
    off = run_engine(spec(model, prompts), tmp_path, **RUNNERS[runner])
    on = run_engine(spec(model, prompts, POOL), tmp_path, **RUNNERS[runner])
    assert all(r["bound"] for r in on["kvflash"]), on["kvflash"]
    assert on["tokens"] == off["tokens"]
    assert sum(r["page_outs"] for r in on["kvflash"]) == 0


@pytest.mark.skipif(TP != 1, reason="the scheduler probe runs in-process")
@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_prompt_8x_the_pool_completes_within_the_pool_and_pages_bit_exact(tiny_model, tmp_path, runner):
    model = tiny_model("laguna")
    out = run_engine(spec(model, [prompt(8 * POOL + 100, 5), prompt(3 * POOL, 6)], POOL, kvflash_probe=True),
                     tmp_path, VLLM_ENABLE_V1_MULTIPROCESSING="0", **RUNNERS[runner])
    probe = out["kvflash_probe"]
    assert [len(t) for t in out["tokens"]] == [32, 32]
    assert 0 < probe["most_blocks"] <= probe["pool_blocks"], probe
    stats = out["kvflash"][0]
    assert stats["page_outs"] >= (8 * POOL - POOL) // 64, stats
    assert probe["loads_checked"] == probe["loads_exact"], probe


def test_hybrid_target_with_kvflash_completes_a_long_prompt(trained_hybrid, tmp_path):
    out = run_engine(spec(trained_hybrid, [prompt(8 * POOL + 100, 7)], POOL), tmp_path)
    assert len(out["tokens"][0]) == 32 and all(r["bound"] for r in out["kvflash"]), out["kvflash"]


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_cuda_graphs_give_the_tokens_of_graphless_steps_with_a_pool_8x_smaller(tiny_model, tmp_path, runner):
    """A replayed decode graph reads and writes the addresses it captured: KVFlash's pooled lengths and queries
    must follow each step there as they do without graphs. Pooled output is lossy but deterministic, so the same
    compiled model with and without CUDA graphs must give the same tokens, past a decode-time reselection (every
    70 tokens at this context). ``enforce_eager`` is no reference: it also turns torch.compile off, whose other
    bf16 rounding flips this random model's near-tied tokens (on an H200 they parted after 11 tokens). vLLM alone,
    with and without graphs, is the control that the comparison can see a difference at all."""
    model, prompts = tiny_model("laguna"), [prompt(8 * POOL + 100, 8), prompt(5 * POOL, 9)]
    out = {}
    for pool in (None, POOL):
        graphs = spec(model, prompts, pool, max_tokens=96)
        graphless = {**graphs, "llm": {**graphs["llm"], "compilation_config": {"cudagraph_mode": "NONE"}}}
        out[pool] = [run_engine(s, tmp_path, **RUNNERS[runner]) for s in (graphs, graphless)]
        assert out[pool][0]["cudagraph_mode"] != "NONE" and out[pool][1]["cudagraph_mode"] == "NONE"
    assert out[None][0]["tokens"] == out[None][1]["tokens"], "vLLM alone differs with and without graphs here"
    kv_graphs, kv_graphless = out[POOL]
    assert kv_graphs["tokens"] == kv_graphless["tokens"]
    assert kv_graphs["tokens"] != out[None][0]["tokens"], "the pool changed nothing: the test pages nothing"
    assert min(r["reselections"] for r in kv_graphs["kvflash"]) > 0, kv_graphs["kvflash"]
