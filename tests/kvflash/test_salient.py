"""The salient policy's summary and scores, pure torch (``kernels/chunk_salient/naive.py``, ``policies.Salient``):
key 1 is the key farthest from the chunk's mean, key 2 the farthest from both; only the scored dims are stored, in
int4 with an fp16 scale; a chunk scores its best logit over both keys, query rows and layers, and at least its
predecessor's score."""

from types import SimpleNamespace

import pytest
import torch

from vllm_luce.kernels.chunk_salient import row_bytes, salient_decode, salient_from_keys, salient_scores_naive
from vllm_luce.kernels.chunk_salient.naive import pack_int4, salient_pair
from vllm_luce.kernels.scored_dims import FAST_PAIRS, ScoredDims
from vllm_luce.kvflash.pool_store import TensorStore
from vllm_luce.kvflash.policies import QK, Salient, make_policy


def _chunk(*rows):
    """[layers=1, tokens, kv_heads=1, head] keys from the tokens' rows."""
    return torch.tensor(rows, dtype=torch.float32)[None, :, None]


def test_key_2_is_the_farthest_point_not_the_second_farthest_from_the_mean():
    keys = _chunk([0, 0, 0], [0, 0, 0], [0, 0, 0], [5.6, 0, 0], [5.25, 0, 0], [0, 0, 0], [0, -3.5, 0], [0, 0, 0])
    decoded = salient_decode(salient_from_keys(keys), 3)[0, 0]
    # key 1: [5.6, 0, 0]; [5.25, 0, 0] is the next farthest from the mean, but next to key 1; [0, -3.5, 0] is far
    # from both
    torch.testing.assert_close(decoded, torch.tensor([[5.6, 0, 0], [0, -3.5, 0]]), atol=0.01, rtol=0)


def test_ties_go_to_the_first_token_and_a_nan_distance_counts_as_infinite():
    keys = _chunk([0, 0], [3.5, 0], [-3.5, 0], [0, 3.5], [0, -3.5])  # mean 0: four keys equally far from it
    decoded = salient_decode(salient_from_keys(keys), 2)[0, 0]
    assert decoded.tolist() == [[3.5, 0.0], [-3.5, 0.0]]  # then three equally far from both: the first of them
    nan = _chunk([3.5, 0], [float("nan"), 0], [7.0, 0])  # the mean is NaN: every distance counts as +inf
    assert salient_decode(salient_from_keys(nan), 2)[0, 0].tolist() == [[3.5, 0.0], [3.5, 0.0]]


def test_keys_pack_as_int4_two_to_a_byte_with_the_fp16_scale_after_them():
    x = torch.tensor([3.5, -1.75, 0.25, 0.75, -3.5])  # scale 3.5 / 7 = 0.5: 7, -3.5 -> -4, 0.5 -> 0, 1.5 -> 2, -7
    packed = pack_int4(x)
    assert packed.tolist() == [0xC7, 0x20, 0x09, 0x00, 0x38]  # element 2j low; the odd tail's high nibble 0; 0x3800
    assert salient_decode(packed, 5).tolist() == [3.5, -2.0, 0.0, 1.0, -3.5]
    assert len(packed) == row_bytes(5) == 5 and row_bytes(48) == 26
    assert salient_decode(pack_int4(torch.zeros(4)), 4).tolist() == [0.0] * 4  # scale 0: zeros, not NaN
    assert salient_decode(pack_int4(torch.tensor([1.0, float("nan")])), 2).isnan().all()
    assert salient_decode(pack_int4(torch.tensor([1.0, float("inf")])), 2).isnan().all()
    scale = (torch.tensor([1.3]) / 7).half()  # fp16 rounds the scale, little-endian after the values
    assert pack_int4(torch.tensor([1.3, 0.2]))[-2:].tolist() == scale.view(torch.uint8).tolist()


def test_summaries_keep_only_the_scored_dims_and_their_bytes():
    """Per layer and KV head ``2 * (ceil(Dn / 2) + 2)`` bytes for ``Dn`` scored dims: 52 on the trained fixture (64
    dims, 16 rotated) against 256 for QK's fp32 mean; ``D`` where the whole head rotates (Qwen3-8B: 128 against 512,
    the two fastest pairs left out)."""
    store = TensorStore(2, (2, 64, 2, 64))  # fixture: 2 layers, 64 tokens, 2 KV heads, head 64
    store.data.normal_()
    summary = Salient(scored=ScoredDims(16)).summarize(store, 1)
    assert summary.shape == (2, 2, 2, 26) and summary.dtype == torch.uint8
    assert summary[0, 0].numel() == 52 and summary.numel() == 208  # per layer and KV head; per chunk
    keys = store.data[1]  # the chunk's keys, summarised through the policy's scored dims
    assert torch.equal(summary, salient_from_keys(keys, ScoredDims(16)))
    assert torch.equal(summary, pack_int4(salient_pair(keys)[..., 16:]))
    whole = ScoredDims(FAST_PAIRS, 64)  # a head that rotates whole, neox pairs (i, i + 32)
    assert whole.index(128).tolist() == [*range(2, 64), *range(66, 128)]
    assert 2 * row_bytes(whole.count(128)) == 128  # a quarter of 4 * 128
    assert 36 * 8 * 2 * row_bytes(whole.count(128)) == 36_864 == 147_456 // 4  # Qwen3-8B's shape per chunk (QK)
    assert torch.equal(salient_from_keys(keys, ScoredDims(2, 32)), pack_int4(salient_pair(keys)[..., [
        *range(2, 32), *range(34, 64)]]))
    for bad in (ScoredDims(64), ScoredDims(3, 32), ScoredDims(1, 48)):  # no dim left; odd runs; not whole periods
        with pytest.raises(ValueError, match="scored dims"):
            salient_from_keys(keys, bad)


def _pair(first, second=None):
    """[layers=1, kv_heads=1, 2, bytes] summary of two keys of the same length."""
    first = torch.tensor(first, dtype=torch.float32)
    second = torch.zeros_like(first) if second is None else torch.tensor(second, dtype=torch.float32)
    return pack_int4(torch.stack([first, second]))[None, None]


def test_a_chunk_scores_its_best_key_row_and_layer():
    two_layers = torch.cat([_pair([3.5, 0, 0, 0]), _pair([0, 0, 0, 0], [0, 0, -7.0, 0])])  # key 2 of layer 1
    pager = SimpleNamespace(queries=torch.tensor([[[2.0, 0, 0, 0]], [[0, 0, -2.0, 0]]]),
                            summaries={0: two_layers, 2: torch.cat([_pair([0, 0, 0, 0])] * 2)})
    assert Salient().scores(pager, [0, 2]).tolist() == [7.0, 0.0]  # max(2 * 3.5, 2 * 7) / sqrt(4); zero keys: 0
    assert isinstance(Salient(), QK) and Salient.name == "salient"


def test_a_chunk_scores_at_least_its_predecessors_score():
    """s'(c) = max(s(c), s(c - 1)), s(c - 1) from c - 1's summary whether c - 1 is a candidate or not (here the sink,
    chunk 0, and chunk 4); a predecessor's own lift does not carry on; a chunk without a summarised predecessor keeps
    its score. The tensor-parallel reduction sees every scored chunk."""
    scores = {0: 5.0, 1: 1.0, 2: 2.0, 4: 6.0, 5: 3.0, 6: 0.5, 8: 0.25}
    summaries = {c: _pair([7.0 * s / 7, 0]) for c, s in scores.items()}
    pager = SimpleNamespace(queries=torch.tensor([[[2 ** 0.5, 0]]]), summaries=summaries)
    seen = []
    policy = Salient(reduce_max=lambda t: seen.append(t.shape) or t)
    got = policy.scores(pager, [1, 2, 5, 6, 8])
    torch.testing.assert_close(got, torch.tensor([5.0, 2.0, 6.0, 3.0, 0.25]), atol=0.01, rtol=0)
    assert seen == [(7, 1)]  # the 5 candidates, then chunks 0 and 4


def test_salient_scores_without_the_rotated_dims_where_only_part_of_the_head_rotates():
    near = torch.tensor([[7.0, 0, 0, 1.0]])  # a position match, rotated dims first
    far = torch.tensor([[0.0, 0, 0, 7.0]])  # what the query asks for
    queries = torch.tensor([[[1.0, 0, 0, 1.0]]])
    every = SimpleNamespace(queries=queries, summaries={0: _pair(near[0].tolist()), 2: _pair(far[0].tolist())})
    torch.testing.assert_close(Salient().scores(every, [0, 2]), torch.tensor([4.0, 3.5]), atol=2e-3, rtol=0)
    scored = SimpleNamespace(queries=queries, summaries={0: _pair(near[0, 2:].tolist()), 2: _pair(far[0, 2:].tolist())})
    torch.testing.assert_close(Salient(scored=ScoredDims(2)).scores(scored, [0, 2]), torch.tensor([0.5, 3.5]),
                               atol=2e-3, rtol=0)
    assert scored.queries[0, 0, 0] == 1.0  # the pager's queries are left as they were
    assert make_policy("salient", scored=ScoredDims(2)).scored == ScoredDims(2)
    with pytest.raises(ValueError, match="expected"):  # summaries of every dim do not score without the rotated ones
        salient_scores_naive(queries, torch.stack([every.summaries[0]]), ScoredDims(2))
    halves = SimpleNamespace(queries=torch.tensor([[[9.0, 0, 1.0, 1.0, 9.0, 0, 1.0, 1.0]]]),
                             summaries={0: _pair([0.0, 7.0, 0.0, 7.0]), 2: _pair([1.0, 0.0, 1.0, 0.0])})
    expected = torch.tensor([14.0, 2.0]) / 8 ** 0.5  # dims 2, 3, 6 and 7: the last two of each half
    torch.testing.assert_close(Salient(scored=ScoredDims(2, 4)).scores(halves, [0, 2]), expected, atol=2e-2, rtol=0)
