"""KVFlash's query window (``query_window.py``), pure torch: the window's rows keep each query head's tokens next
to each other so that policies group them as they group heads; rejected drafts leave it; the runtime hands a prefill
step's last tokens and then each token before a decision position to the pager; a salient key the window points at
lifts its chunk."""

from types import SimpleNamespace

import numpy as np
import torch

from tests.kvflash.test_worker_v2 import CM, D, POOL, fake_runner, step
from vllm_luce.config import LuceConfig
from vllm_luce.kernels.chunk_salient import row_bytes, salient_decode, salient_scores_naive
from vllm_luce.kernels.chunk_salient.naive import pack_int4
from vllm_luce.kvflash.pager import PagerConfig, RequestPager
from vllm_luce.kvflash.pool_store import TensorStore
from vllm_luce.kvflash.policies import make_policy
from vllm_luce.kvflash.query_window import push_queries, trim_queries, window_rows


def test_a_window_of_one_is_the_latest_tokens_queries():
    pager = SimpleNamespace(num_tokens=5)
    q = torch.randn(5, 2, 4, 8)
    push_queries(pager, q, 1)
    assert torch.equal(pager.queries, q[-1])


def test_rejected_drafts_leave_the_window_and_the_rows_kept_for_them_fill_it():
    """A verify step of 1 + 4 tokens hands 8 + 4 rows; 3 drafts rejected, the window is the 8 tokens before the
    next step's start, as if the request had decoded one token a step."""
    pager = SimpleNamespace(num_tokens=0)
    prompt = torch.randn(20, 1, 2, 4)
    pager.num_tokens = 20
    push_queries(pager, prompt, 8, keep=12)
    verify = torch.randn(5, 1, 2, 4)
    pager.num_tokens = 25
    push_queries(pager, verify, 8, keep=12)
    trim_queries(pager, 22)  # positions 22-24 rejected
    assert pager.query_end == 22 and torch.equal(pager.query_tokens[-8:], torch.cat([prompt, verify])[14:22])
    assert pager.queries.shape == (1, 2 * 8, 4)
    trim_queries(pager, 0)  # a restart: nothing is left
    assert pager.query_tokens is None and pager.queries is None


def test_rows_that_do_not_adjoin_those_held_replace_them():
    pager = SimpleNamespace(num_tokens=10)
    push_queries(pager, torch.randn(10, 1, 2, 4), 8)
    pager.num_tokens = 30  # steps 10-28 handed nothing (far from a decision)
    latest = torch.randn(1, 1, 2, 4)
    push_queries(pager, latest, 8)
    assert torch.equal(pager.query_tokens, latest) and pager.query_end == 30


def test_the_window_keeps_the_last_tokens_each_heads_rows_adjacent():
    pager = SimpleNamespace(num_tokens=3)
    q = torch.randn(3, 2, 4, 8)  # 3 tokens, 2 layers, 4 query heads
    push_queries(pager, q, 4)
    assert pager.queries.shape == (2, 12, 8)
    assert torch.equal(pager.queries[1, 2 * 3 + 1], q[1, 1, 2])  # head 2's token 1 at row 2 * 3 + 1
    more = torch.randn(2, 2, 4, 8)  # two more tokens: the window keeps the last 4 of the 5
    pager.num_tokens = 5
    push_queries(pager, more, 4)
    assert torch.equal(pager.query_tokens, torch.cat([q[1:], more]))
    assert torch.equal(pager.queries[0, 3 * 4 + 3], more[1, 0, 3])
    # grouped over 2 KV heads, rows 0-7 (heads 0-1, 4 tokens each) belong to KV head 0 as heads 0-1 do
    keys = torch.zeros(1, 2, 2, 2, 8)  # [chunks, layers, KV heads, 2 keys, head]
    keys[0, 0, 1, 0] = torch.randn(8)  # only KV head 1 has a key: its group is heads 2-3, every token of the window
    summaries = pack_int4(keys)
    rows = pager.query_tokens[:, 0, 2:4].reshape(-1, 8)  # layer 0, heads 2-3, 4 tokens each
    expected = max((rows @ salient_decode(summaries[0, 0, 1, 0], 8)).max().item(), 0.0) / 8 ** 0.5
    assert abs(salient_scores_naive(pager.queries, summaries)[0, 0].item() - expected) < 1e-5


def test_window_rows_take_each_requests_last_tokens_and_skip_decode_steps():
    rows, spans = window_rows(np.array([0, 200, 201, 204]), 3, 8)
    assert rows.tolist() == list(range(192, 200)) + [200] + [201, 202, 203]
    assert spans == [(0, 8), (8, 1), (9, 3)]
    assert window_rows(np.array([0, 1, 2]), 2, 8) is None  # one token each: the latest-token buffer has them
    assert window_rows(np.array([0, 200]), 1, 1) is None


def test_the_runtime_hands_a_prefills_last_tokens_then_each_token_before_a_decision_to_the_pager():
    from vllm_luce.kvflash.worker_v2 import bind_v2

    runner, _ = fake_runner()
    luce = LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": POOL, "policy": "salient",
                                                         "query_window": 4}}}, {})
    runtime = bind_v2(runner, luce)
    runner.block_tables.append_block_ids(2, ([1], [9, 4, 12]), overwrite=False)
    layer = runner.compilation_config.static_forward_context["pooled"]
    builder = runner.attn_groups[1][0].metadata_builders[0]
    seen = []
    for start, n in ((0, 252), (252, 1), (253, 1)):  # the tokens before a decision (256)
        step(runner, start, n)  # hands the previous step's queries to the pager, then plans this one
        if seen:
            expected = torch.cat(seen)[-4:].float()  # the last 4 tokens run so far
            assert torch.equal(runtime.pagers["r"].query_tokens[:, 0], expected)
        builder.build(0, CM(1, torch.tensor([start + n]), start + n, n))
        seen.append(torch.randn(n, 4, D))
        layer.impl.forward(layer, seen[-1], None, None, None, SimpleNamespace(num_actual_tokens=n), None)
    step(runner, 254, 1)
    pager = runtime.pagers["r"]
    assert torch.equal(pager.query_tokens[:, 0], torch.cat([seen[0][-2:], seen[1], seen[2]]).float())
    assert pager.queries.shape == (1, 4 * 4, D)


def test_a_salient_key_the_window_points_at_lifts_its_chunk():
    cfg = PagerConfig(pool_tokens=512)
    store = TensorStore(cfg.pool_chunks, (2, 64, 2, 16))
    pager, policy = RequestPager(cfg, store), make_policy("salient")
    g = torch.Generator().manual_seed(0)
    needle = torch.randn(16, generator=g) * 4
    for start in range(0, 1024, 64):
        pager.prepare(start, 64, policy)
        written = store.data[pager.stored_at[start // 64]]  # [layers, tokens, KV heads, head]
        written.copy_(torch.randn(written.shape, generator=g) * 0.5)
        if start == 320:  # chunk 5: one token of layer 1, KV head 1 stands out
            written[1, 17, 1] = needle
    assert 5 in pager.host  # paged out during the prefill
    window = torch.randn(8, 2, 4, 16, generator=g) * 0.1
    window[-3, 1, 2] = needle  # an earlier token of the window, a query head of KV head 1's group
    push_queries(pager, window, 8)
    pager.prepare(1024, 1, policy, prompt_end=True)
    assert 5 in pager.resident
    summary = pager.summaries[5]
    assert summary.dtype == torch.uint8 and summary.shape == (2, 2, 2, row_bytes(16))
    assert torch.equal(summary[1, 1, 0], pack_int4(needle.to(store.data.dtype)))  # key 1: the needle


def _model(*rotaries):
    from types import SimpleNamespace as NS

    modules = {f"layers.{i}.attn": NS(rotary_emb=r) for i, r in enumerate(rotaries)}
    return NS(named_modules=lambda: modules.items()), [f"layers.{i}.attn.attn" for i in range(len(rotaries))]


def test_scored_dims_leave_out_what_the_pooled_layers_rotate():
    from types import SimpleNamespace as NS

    from vllm_luce.kernels.scored_dims import ScoredDims
    from vllm_luce.kvflash.worker import scored_dims

    assert scored_dims(*_model(NS(rotary_dim=16, head_size=64), NS(rotary_dim=16, head_size=64))) == ScoredDims(16)
    assert scored_dims(*_model(NS(rotary_dim=64, head_size=64))) == ScoredDims(2, 32)  # whole: less 2 fast pairs
    assert scored_dims(*_model(NS(rotary_dim=64, head_size=64, is_neox_style=False))) == ScoredDims(4)  # (2i, 2i+1)
    assert scored_dims(*_model(NS(rotary_dim=16, head_size=64), NS(rotary_dim=32, head_size=64))) == ScoredDims()
    assert scored_dims(*_model(None)) == ScoredDims()  # no rotary embedding found
    sin_at_1 = torch.tensor([0.84, 0.1, 0.01, 0.001, 0.0, 0.0, 0.0, 0.0])  # 4 of 8 pairs rotate (Gemma 4's way)
    cache = torch.stack([torch.ones(16), torch.cat([torch.ones(8), sin_at_1])])
    rotary = NS(rotary_dim=16, head_size=16, cos_sin_cache=cache)
    assert scored_dims(*_model(rotary)) == ScoredDims(4, 8)  # dims 4-7 and 12-15
    cache[1, 8 + 4] = 0.0001  # 5 rotate: 3 dims a half would be odd, so the slowest of the 5 is kept
    assert scored_dims(*_model(rotary)) == ScoredDims(4, 8)
    cache[1, 8:] = 0.5  # all 8: less the 2 fastest
    assert scored_dims(*_model(rotary)) == ScoredDims(2, 8)
