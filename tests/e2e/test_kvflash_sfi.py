"""KVFlash's SFI selection mode through real vLLM (CPU, V1 runner, tiny Qwen3.6; vLLM sizes its KV blocks
to its Gated DeltaNet state: 640 tokens here, 10 chunks of 64):
identity when the budget covers the context, fast steps that read a suffix of the request's own block row
(vLLM's attention metadata, as built), dense refresh steps, full residency in the scheduler, releases."""

import pytest

from tests.e2e.test_kvflash import blocks_held, greedy, kvflash, make_llm, prompt, runtime
from tests.e2e.dflash_probe import engine
from vllm_luce.kvflash.worker import pooled_group

BUDGET = 384


@pytest.fixture(scope="module")
def qwen(tiny_model):
    return tiny_model("qwen3_6")


@pytest.fixture(scope="module")
def short_prompts():
    return [prompt(90, 11), prompt(BUDGET - 20, 12)]


@pytest.fixture(scope="module")
def reference(qwen, short_prompts):
    llm = make_llm(qwen)
    tokens = greedy(llm, short_prompts)
    del llm
    return tokens


@pytest.fixture(scope="module")
def sfi(qwen, reference):
    return make_llm(qwen, kvflash(BUDGET, selection="sfi"))


def runner(llm):
    return engine(llm).model_executor.driver_worker.worker.model_runner


def test_a_budget_covering_the_context_gives_the_same_tokens_as_kvflash_off(sfi, reference, short_prompts):
    before = runtime(sfi).stats()
    assert greedy(sfi, short_prompts) == reference
    after = runtime(sfi).stats()
    assert after["sparse_steps"] == before["sparse_steps"] and after["moves"] == before["moves"]


def test_a_long_context_decodes_on_fast_steps_with_dense_refreshes_and_keeps_every_block(sfi):
    before = runtime(sfi).stats()
    with blocks_held(sfi) as most:
        out = greedy(sfi, [prompt(8 * BUDGET + 100, 13)], gen=80)
    after = runtime(sfi).stats()
    assert len(out[0]) == 80
    # tau = max(16, context // 45), 72 by decode step 72: that step is dense, the other 78 are fast
    assert after["sparse_steps"] - before["sparse_steps"] == 78
    assert after["dense_steps"] - before["dense_steps"] == 1
    assert after["reselections"] - before["reselections"] == 2 and after["moves"] > before["moves"]
    block = runtime(sfi).block_size
    assert max(most) == -(-(8 * BUDGET + 100 + 80) // block)  # all KV resident: every block held
    finished = set(runtime(sfi).pagers)
    greedy(sfi, [prompt(10, 15)], gen=2)  # the next steps release what finished
    assert finished and finished.isdisjoint(runtime(sfi).pagers)


def test_fast_steps_read_a_suffix_of_the_requests_block_row(sfi, monkeypatch):
    r = runner(sfi)
    builder = r.attn_groups[pooled_group(r.kv_cache_config)][0].metadata_builders[0]
    recorded, build = [], builder._inner.build

    def recording(prefix, cm, *args, **kwargs):
        recorded.append((int(cm.seq_lens[0]), cm.block_table_tensor[0].clone()))
        return build(prefix, cm, *args, **kwargs)

    monkeypatch.setattr(builder._inner, "build", recording)
    n, block = 6 * BUDGET + 50, runtime(sfi).block_size
    greedy(sfi, [prompt(n, 14)], gen=20)
    decode = recorded[-19:]  # the first token comes from the prefill
    full_row = recorded[-20][1]  # the last prefill step: dense over the whole row
    fast = [(length, row) for length, row in decode if length < n]
    assert len(fast) == 19  # every decode step (tau = 52)
    for step, (length, row) in enumerate(fast, start=1):
        skipped = n + step - length
        assert skipped > 0 and skipped % block == 0
        blocks = -(-length // block)
        s = skipped // block
        assert row[:blocks].tolist() == full_row[s: s + blocks].tolist()
        assert length <= BUDGET + block - 64 + step  # budget, block alignment, the tail's growth


def test_bad_selection_stops_startup_naming_the_key(qwen):
    with pytest.raises(Exception, match=r"luce\.kvflash\.selection: got 'dense'; expected one of 'page'"):
        make_llm(qwen, kvflash(selection="dense"))


def test_refresh_swaps_move_chunk_bytes_exactly_in_vllms_cache(sfi, monkeypatch):
    import torch

    from vllm_luce.kvflash.kv_store import PagedPoolStore

    checked, rearrange = [], PagedPoolStore.rearrange

    def checking(store, moves, loads):
        before = {src: store.read(src).clone() for _, src in moves}
        rearrange(store, moves, loads)
        checked.extend(torch.equal(store.read(dst).view(torch.uint8), before[src].view(torch.uint8))
                       for dst, src in moves)

    monkeypatch.setattr(PagedPoolStore, "rearrange", checking)
    greedy(sfi, [prompt(6 * BUDGET, 16)], gen=8)
    assert checked and all(checked)
