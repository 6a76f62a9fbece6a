"""Draft-free decode-only steps of the CPU Gated DeltaNet path in a speculating engine: the plain engine's
decode (C++ conv where the CPU has bf16 dot products) on the wide buffer's first width - 1 columns must
give vLLM's own results (its torch conv on that view, on this CPU), leave the other columns alone, keep
its views until the cache is rebound, and hand steps with prompt rows or drafts to vLLM."""

from types import SimpleNamespace

import pytest
import torch

G = pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention")

from vllm_luce.patches import cpu_gdn_nonspec as P  # noqa: E402

HEADS, HEAD_DIM, WIDTH, K = 2, 64, 4, 15


class Layer(torch.nn.Module):
    def __init__(self, g):
        super().__init__()
        dim = 3 * HEADS * HEAD_DIM
        self.conv1d = SimpleNamespace(weight=torch.randn(dim, 1, WIDTH, generator=g).bfloat16(),
                                      bias=torch.randn(dim, generator=g).bfloat16())
        self.activation = "silu"
        self.A_log = torch.randn(HEADS, generator=g)
        self.dt_bias = torch.randn(HEADS, generator=g).bfloat16()

    def rearrange_mixed_qkv(self, mixed_qkv):
        q, k, v = mixed_qkv.split(HEADS * HEAD_DIM, dim=-1)
        return (t.reshape(1, t.shape[0], HEADS, HEAD_DIM) for t in (q, k, v))


def block_table_column(slots):
    """Column 0 of a block table, as vLLM passes the state slots: a strided view."""
    table = torch.zeros(len(slots), 16, dtype=torch.int32)
    table[:, 0] = torch.tensor(slots, dtype=torch.int32)
    return table[:, 0]


def step(slots, n, g):
    dim = 3 * HEADS * HEAD_DIM
    meta = SimpleNamespace(num_decodes=n, num_decode_tokens=n, num_prefills=0, num_prefill_tokens=0,
                           spec_sequence_masks=None,
                           non_spec_state_indices_tensor=block_table_column(slots),
                           non_spec_query_start_loc=torch.arange(n + 1, dtype=torch.int32))
    x = torch.randn(n, dim, generator=g).bfloat16()
    a, b = torch.randn(n, HEADS, generator=g).bfloat16(), torch.randn(n, HEADS, generator=g).bfloat16()
    return meta, x, a, b


def test_decode_matches_vllms_non_speculative_path():
    g = torch.Generator().manual_seed(0)
    layer = Layer(g)
    dim, n_slots = 3 * HEADS * HEAD_DIM, 9
    conv = torch.randn(n_slots, WIDTH - 1 + K, dim, generator=g).bfloat16().transpose(1, 2)  # SD layout's view
    ssm = torch.randn(n_slots, HEADS, HEAD_DIM, HEAD_DIM, generator=g) * 0.1
    ours = (conv.clone(), ssm.clone())
    vllms = (conv.clone(), ssm.clone())
    original = getattr(G._spec_aware_nonspec, "__wrapped__", G._spec_aware_nonspec)
    for slots in ([3, 7, 1, 5, 8], [3, 7, 1, 5, 8], [7], [3, 7, 1, 5, 8]):  # each reads the history rolled before
        n = len(slots)
        meta, x, a, b = step(slots, n, g)
        out_ours = torch.full((n, HEADS, HEAD_DIM), float("nan")).bfloat16()
        out_vllm = torch.full_like(out_ours, float("nan"))
        P.decode(layer, meta, x, b, a, out_ours, ours[0][:, :, : WIDTH - 1], ours[1])
        # vLLM's own path refuses a one-row strided column (it never decodes there); it gets a dense copy.
        dense_slots = torch.tensor(slots, dtype=torch.int32)
        dense = SimpleNamespace(**{**vars(meta), "non_spec_state_indices_tensor": dense_slots})
        original(layer, dense, x, b, a, out_vllm, vllms[0], vllms[1], WIDTH)
        assert torch.isfinite(out_ours.float()).all()
        # The two convs round their bf16 outputs differently (as a plain engine's C++ conv and vLLM's torch
        # conv do), which reaches the outputs and states by about one bf16 step.
        torch.testing.assert_close(out_ours.float(), out_vllm.float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(ours[1], vllms[1], rtol=2e-2, atol=2e-2)
        assert torch.equal(ours[0][:, :, : WIDTH - 1], vllms[0][:, :, : WIDTH - 1])  # the history, exactly
    assert torch.equal(ours[0][:, :, WIDTH - 1:], conv[:, :, WIDTH - 1:])  # wide columns untouched
    for untouched in (0, 2, 4, 6):
        assert torch.equal(ours[0][untouched], conv[untouched]) and torch.equal(ours[1][untouched], ssm[untouched])


def test_the_entry_decodes_on_views_kept_until_the_cache_is_rebound():
    g = torch.Generator().manual_seed(1)
    layer = Layer(g)
    dim, n_slots = 3 * HEADS * HEAD_DIM, 6
    conv = torch.randn(n_slots, WIDTH - 1 + K, dim, generator=g).bfloat16()  # SD layout: slots x state_len x dim
    ssm = torch.randn(n_slots, HEADS, HEAD_DIM, HEAD_DIM, generator=g) * 0.1
    layer.kv_cache = (conv, ssm)
    wrapper = P._make_wrapper(lambda *args: pytest.fail("a draft-free decode step went to vLLM's code"))
    meta, x, a, b = step([4, 1], 2, g)
    reference = (conv.clone().transpose(1, 2), ssm.clone())
    expected = torch.full((2, HEADS, HEAD_DIM), float("nan")).bfloat16()
    P.decode(layer, meta, x, b, a, expected, reference[0][:, :, : WIDTH - 1], reference[1])
    out = torch.full_like(expected, float("nan"))
    wrapper(layer, meta, x, b, a, out, WIDTH, WIDTH - 1 + K)
    assert torch.equal(out, expected) and torch.equal(conv.transpose(1, 2), reference[0])
    kept = layer._luce_state_views
    wrapper(layer, meta, x, b, a, out, WIDTH, WIDTH - 1 + K)
    assert layer._luce_state_views is kept
    layer.kv_cache = (conv.clone(), ssm.clone())  # rebound (a new cache): new views on the new tensors
    wrapper(layer, meta, x, b, a, out, WIDTH, WIDTH - 1 + K)
    history, state = P.state_views(layer, WIDTH)
    assert history.data_ptr() == layer.kv_cache[0].data_ptr() and state.data_ptr() == layer.kv_cache[1].data_ptr()
    assert meta._luce_slots.is_contiguous() and meta._luce_slots.tolist() == [4, 1]


def test_steps_with_prompt_rows_drafts_or_no_decodes_run_vllms_code():
    calls = []
    wrapper = P._make_wrapper(lambda *args: calls.append(args[1]))
    for meta in (SimpleNamespace(spec_sequence_masks=None, num_prefills=1, num_decodes=2),
                 SimpleNamespace(spec_sequence_masks=None, num_prefills=0, num_decodes=0),
                 SimpleNamespace(spec_sequence_masks=torch.ones(2, dtype=torch.bool), num_prefills=0, num_decodes=2)):
        wrapper(None, meta, None, None, None, None, WIDTH, WIDTH - 1 + K)
    assert len(calls) == 3
