"""Draft-free decode-only steps of the CPU Gated DeltaNet path in a speculating engine, on every host kind
(``test_cpu_isa.force_host``): the plain engine's decode on the wide buffer's first width - 1 columns must give
a plain causal conv (+ silu) of each row's true history, as vLLM's own non-speculative path does (bit for bit
where both run the same conv), leave the other columns alone, keep its views until the cache is rebound, and
hand steps with prompt rows or drafts to vLLM.

Issue 39: on AMX hosts this test once failed (125 of 640 outputs off, up to 0.197) because it handed vLLM's
path, which there runs the C++ conv on packed weights, an unpacked weight; the product's conv matched the
reference. vLLM packs the weight at load on such hosts, as ``loaded_conv1d`` does here."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tests.patches.test_cpu_isa import BF16_DOT, HOSTS, GdnLayer, force_host

G = pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention")

from vllm_luce.patches import cpu_gdn_nonspec as P  # noqa: E402

HEADS, HEAD_DIM, WIDTH, K = 2, 64, 4, 15
CPP, VEC = "_causal_conv1d_update_cpu", "causal_conv1d_update_cpu"  # vLLM's C++ conv and its generic one


def Layer(g):  # noqa: N802 - a layer, as the tests read
    return GdnLayer(g, WIDTH, HEADS, HEAD_DIM)


def reference(layer, histories, x):
    """A plain causal depthwise conv + silu, in float64, of each row's last width - 1 inputs and its new one."""
    seq = torch.cat([histories.double(), x.double()[:, :, None]], dim=-1)  # [n, dim, width]
    return F.silu((seq * layer.weight.double()).sum(-1) + layer.conv1d.bias.double())


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


@pytest.mark.parametrize("kind", HOSTS)
def test_decode_is_a_plain_causal_conv_of_the_history_as_vllms_non_speculative_path(monkeypatch, kind):
    calls = force_host(monkeypatch, kind)
    ours_op = CPP if kind in BF16_DOT else VEC  # the plain engine's decode conv
    vllms_op = CPP if kind in ("amx", "arm_bf16") else VEC  # vLLM's in a speculating engine
    g = torch.Generator().manual_seed(0)
    layer = Layer(g)
    dim, n_slots = 3 * HEADS * HEAD_DIM, 9
    conv = torch.randn(n_slots, WIDTH - 1 + K, dim, generator=g).bfloat16().transpose(1, 2)  # SD layout's view
    ssm = torch.randn(n_slots, HEADS, HEAD_DIM, HEAD_DIM, generator=g) * 0.1
    ours = (conv.clone(), ssm.clone())
    vllms = (conv.clone(), ssm.clone())
    history = conv[:, :, : WIDTH - 1].clone()  # each slot's last width - 1 inputs, kept here in plain torch
    original = getattr(G._spec_aware_nonspec, "__wrapped__", G._spec_aware_nonspec)
    for slots in ([3, 7, 1, 5, 8], [3, 7, 1, 5, 8], [7], [3, 7, 1, 5, 8]):  # each reads the history rolled before
        n = len(slots)
        meta, x, a, b = step(slots, n, g)
        out_ours = torch.full((n, HEADS, HEAD_DIM), float("nan")).bfloat16()
        out_vllm = torch.full_like(out_ours, float("nan"))
        calls.clear()
        P.decode(layer, meta, x, b, a, out_ours, ours[0][:, :, : WIDTH - 1], ours[1])
        # vLLM's own path refuses a one-row strided column (it never decodes there); it gets a dense copy.
        dense_slots = torch.tensor(slots, dtype=torch.int32)
        dense = SimpleNamespace(**{**vars(meta), "non_spec_state_indices_tensor": dense_slots})
        original(layer, dense, x, b, a, out_vllm, vllms[0], vllms[1], WIDTH)
        assert [name for name, _ in calls] == [ours_op, vllms_op]
        handed = calls[0][1]  # what the plain engine's conv was given: the history columns, loaded weights
        assert handed["weight"].data_ptr() == layer.conv1d.weight.data_ptr()
        assert handed.get("is_weight_packed", False) is hasattr(layer.conv1d, "_cpu_unpacked_conv_weight")
        states = handed.get("conv_states", handed.get("conv_state"))
        assert states.shape[-1] == WIDTH - 1 and states.data_ptr() == ours[0].data_ptr()
        want = reference(layer, history[slots], x)
        for conv_out in layer.seen:  # ours, then vLLM's: one bf16 rounding from the reference
            torch.testing.assert_close(conv_out.double(), want, rtol=1e-2, atol=1e-2)
        layer.seen.clear()
        history[slots] = torch.cat([history[slots, :, 1:], x[:, :, None]], dim=-1)
        assert torch.isfinite(out_ours.float()).all()
        if ours_op == vllms_op:
            assert torch.equal(out_ours, out_vllm) and torch.equal(ours[1], vllms[1])
        else:  # the two convs round their bf16 outputs differently, which reaches outputs and states by ~1 step
            torch.testing.assert_close(out_ours.float(), out_vllm.float(), rtol=2e-2, atol=2e-2)
            torch.testing.assert_close(ours[1], vllms[1], rtol=2e-2, atol=2e-2)
        assert torch.equal(ours[0][:, :, : WIDTH - 1], history)  # the history, exactly
        assert torch.equal(vllms[0][:, :, : WIDTH - 1], history)
    assert torch.equal(ours[0][:, :, WIDTH - 1:], conv[:, :, WIDTH - 1:])  # wide columns untouched
    assert torch.equal(vllms[0][:, :, WIDTH - 1:], conv[:, :, WIDTH - 1:])
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
