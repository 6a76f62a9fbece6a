"""KVFlash through real vLLM (CPU, V1 runner): bounded residency, identity when the pool covers the
context, bit-exact paging in vLLM's own cache, placement independence, releases, bad settings.

The tiny Qwen3.6 model gets 384-token KV blocks on CPU (vLLM sizes them to match its Gated DeltaNet
state), so a 384-token pool is one block and chunks (64 tokens) live inside blocks.
"""

import contextlib
import random

import pytest
import torch

from tests.e2e.dflash_probe import engine
from vllm_luce.kvflash.kv_store import PagedPoolStore
from vllm_luce.kvflash.policies import Scorer

POOL = 384  # the floor for 64-token chunks: 1 sink + 4 recent + 1 evictable
GEN = 16


def kvflash(pool=POOL, **extra):
    return {"luce": {"kvflash": {"pool_tokens": pool, **extra}}}


def make_llm(path, additional_config=None, max_model_len=4096):
    from vllm import LLM

    return LLM(str(path), max_model_len=max_model_len, enforce_eager=True, dtype="bfloat16",
               additional_config=additional_config or {})


def prompt(n, seed):
    rng = random.Random(seed)
    return {"prompt_token_ids": [rng.randrange(5, 1000) for _ in range(n)]}


def greedy(llm, prompts, gen=GEN):
    from vllm import SamplingParams

    outs = llm.generate(prompts, SamplingParams(max_tokens=gen, temperature=0, ignore_eos=True), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def runtime(llm):
    return engine(llm).model_executor.driver_worker.worker.model_runner.luce_kvflash


def kvflash_manager(llm):
    from vllm_luce.kvflash.spec import KVFlashManager

    managers = engine(llm).scheduler.kv_cache_manager.coordinator.single_type_managers
    return next(m for m in managers if isinstance(m, KVFlashManager))


@contextlib.contextmanager
def blocks_held(llm):
    """Yields a list that collects, at each allocation, how many blocks the KVFlash manager holds for
    the request allocated to."""
    manager = kvflash_manager(llm)
    allocate, held = manager.allocate_new_blocks, []

    def recording(request_id, num_tokens, num_tokens_main_model):
        blocks = allocate(request_id, num_tokens, num_tokens_main_model)
        held.append(len(manager.req_to_blocks[request_id]))
        return blocks

    manager.allocate_new_blocks = recording
    try:
        yield held
    finally:
        del manager.allocate_new_blocks


@pytest.fixture(scope="module")
def qwen(tiny_model):
    return tiny_model("qwen3_6")


@pytest.fixture(scope="module")
def pooled(qwen, reference):
    """The host tier alone (cold chunks in free KV blocks: ``test_kvflash_tiers.py``). Built after the reference
    engine is gone: engines in one process must not overlap."""
    return make_llm(qwen, kvflash(gpu_cold=False))


@pytest.fixture(scope="module")
def short_prompts():
    return [prompt(100, 1), prompt(250, 2), prompt(POOL - GEN, 3)]


@pytest.fixture(scope="module")
def reference(qwen, short_prompts):
    """KVFlash off: the tokens to match when the pool covers the context (then the engine is freed)."""
    llm = make_llm(qwen)
    tokens = greedy(llm, short_prompts + [prompt(3 * POOL, 4)])
    del llm
    return tokens


def test_pool_covering_the_context_gives_the_same_tokens_as_kvflash_off(pooled, reference, short_prompts):
    before = runtime(pooled).stats()["page_outs"]
    assert greedy(pooled, short_prompts) == reference[:3]
    assert runtime(pooled).stats()["page_outs"] == before  # nothing was paged


def test_a_prompt_8x_the_pool_completes_and_the_scheduler_holds_at_most_the_pool(pooled):
    pool_blocks = kvflash_manager(pooled).kv_cache_spec.pool_blocks
    with blocks_held(pooled) as most:
        before = runtime(pooled).stats()["page_outs"]
        out = greedy(pooled, [prompt(8 * POOL + 100, 5)], gen=GEN)
    assert len(out[0]) == GEN
    assert most and max(most) <= pool_blocks == 1
    assert runtime(pooled).stats()["page_outs"] - before >= (8 * POOL - POOL) // 64


def test_page_out_then_in_is_bit_exact_in_vllms_cache(pooled, monkeypatch):
    """Random scores force swaps at every reselection; every chunk paged back in must read back, from
    vLLM's KV cache at its new place, exactly as the bytes that were paged out."""
    rt, checked = runtime(pooled), []
    rearrange = PagedPoolStore.rearrange

    def checking(store, moves, loads):
        rearrange(store, moves, loads)
        for dst, data in loads:
            back = store.read(dst)
            checked.append(torch.equal(back.view(torch.uint8), data.to(back.device).view(torch.uint8)))

    g = torch.Generator().manual_seed(0)
    monkeypatch.setattr(PagedPoolStore, "rearrange", checking)
    monkeypatch.setattr(rt, "policy", Scorer(lambda pager, chunks: torch.rand(len(chunks), generator=g)))
    greedy(pooled, [prompt(4 * POOL, 6)], gen=80)
    assert checked and all(checked)


def test_verify_pages_checks_every_page_in_against_its_page_out_in_vllms_cache(pooled, monkeypatch):
    """``kvflash.verify_pages`` through vLLM: random scores force swaps; every page-in is checked and none differs;
    planted, each page-in written back one step off in vLLM's cache is counted."""
    from vllm_luce.kvflash import pager as pager_module

    rt, checked, check = runtime(pooled), [], pager_module.paged_in_mismatches

    def counting(sums, store, stored_at, chunks):
        checked.append(check(sums, store, stored_at, chunks))
        return checked[-1]

    g = torch.Generator().manual_seed(0)
    monkeypatch.setattr(pager_module, "paged_in_mismatches", counting)
    monkeypatch.setattr(rt, "verify_pages", True)
    monkeypatch.setattr(rt, "policy", Scorer(lambda pager, chunks: torch.rand(len(chunks), generator=g)))
    before = rt.stats()["page_mismatches"]
    greedy(pooled, [prompt(4 * POOL, 6)], gen=80)
    assert checked and not any(checked) and rt.stats()["page_mismatches"] == before
    rearrange = PagedPoolStore.rearrange

    def corrupting(store, moves, loads):
        rearrange(store, moves, loads)
        for dst, _ in loads:
            store.write(dst, store.read(dst) + 1)

    monkeypatch.setattr(PagedPoolStore, "rearrange", corrupting)
    greedy(pooled, [prompt(4 * POOL, 7)], gen=80)
    assert rt.stats()["page_mismatches"] > before


def test_a_long_prompts_last_token_runs_alone_after_a_reselection(pooled, monkeypatch):
    """vllm-luce's scheduler stops the last prefill chunk one token short, and the pager reselects before
    that token (the step that samples the first answer token); a prompt within the pool is not split."""
    from vllm_luce.kvflash.pager import RequestPager

    calls, prepare = [], RequestPager.prepare

    def recording(self, start, num_new, policy, decoded=0, prompt_end=False):
        calls.append((start, num_new, prompt_end, self.stats.reselections))
        return prepare(self, start, num_new, policy, decoded=decoded, prompt_end=prompt_end)

    monkeypatch.setattr(RequestPager, "prepare", recording)
    n = 3 * POOL
    greedy(pooled, [prompt(n, 7)], gen=2)
    ends = [c for c in calls if c[2]]
    assert len(ends) == 1 and ends[0][:2] == (n - 1, 1), calls
    before = calls[calls.index(ends[0]) - 1]
    assert before[0] + before[1] == n - 1 and before[3] == 0  # the prefill stopped short; no reselection yet
    calls.clear()
    greedy(pooled, [prompt(POOL - GEN, 8)], gen=2)
    assert not any(c[2] for c in calls) and (POOL - GEN - 1, 1) not in [c[:2] for c in calls], calls


def test_physical_placement_does_not_change_tokens(pooled):
    """Same prompt with the block pool's free list shuffled (other physical blocks, other order) and
    chunks relocated by compaction: the same greedy tokens."""
    first = greedy(pooled, [prompt(3 * POOL, 7)])
    queue = engine(pooled).scheduler.kv_cache_manager.block_pool.free_block_queue
    blocks = queue.popleft_n(queue.num_free_blocks)
    random.Random(0).shuffle(blocks)
    queue.append_n(blocks)
    assert greedy(pooled, [prompt(3 * POOL, 7)]) == first


def test_pool_smaller_than_the_context_changes_what_attention_sees(pooled, reference):
    """The control for the identity test: with 3x the pool, tokens differ from full KV on a random model
    (so the identity above is not vacuous)."""
    assert greedy(pooled, [prompt(3 * POOL, 4)]) != reference[3:]


def test_aborted_requests_return_their_host_pages(pooled):
    from vllm import SamplingParams

    rt, core = runtime(pooled), pooled.llm_engine
    params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    released_before = rt.released.page_outs
    for wave in range(25):  # 200 requests, 8 at a time, each aborted mid-generation
        ids = [f"abort-{wave}-{i}" for i in range(8)]
        for i, rid in enumerate(ids):
            core.add_request(rid, prompt(POOL + 200 + 17 * i, 1000 * wave + i), params)
        generated = 0
        while generated < 8:  # every request has paged out and started decoding
            generated = sum(1 for o in core.step() if o.outputs and o.outputs[0].token_ids)
        core.abort_request(ids)
    while core.has_unfinished_requests():
        core.step()
    core.add_request("after", prompt(10, 0), SamplingParams(max_tokens=2))  # one more step: releases
    while core.has_unfinished_requests():
        core.step()
    assert rt.released.page_outs > released_before
    assert all(r.startswith("after") for r in rt.pagers) and rt.host_bytes() == 0


@pytest.mark.parametrize("bad, message", [
    (kvflash(pool=100), "luce.kvflash.pool_tokens: got 100; expected a positive multiple of chunk_tokens"),
    (kvflash(pool=256), "luce.kvflash.pool_tokens: got 256; expected at least 384"),
    (kvflash(pool=1.5), "luce.kvflash.pool_tokens: got 1.5; expected a positive integer or 'auto'"),
    (kvflash(policy="mru"), "luce.kvflash.policy: got 'mru'; expected one of"),
    (kvflash(policy="scorer"), "luce.kvflash.policy: got 'scorer'; the drafter scorer is PFlash's, so it needs luce.pflash"),
])
def test_bad_settings_stop_startup_naming_the_key(qwen, bad, message):
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        make_llm(qwen, bad)
