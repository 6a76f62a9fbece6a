"""The prompt conv of a speculating engine's CPU Gated DeltaNet, on every host kind (``test_cpu_isa.force_host``):
where the CPU has bf16 dot products, through vLLM's C++ op on the wide buffer's first width - 1 columns; elsewhere
through vLLM's torch loop on float32 weights. Either way the same outputs as vLLM's loop on bf16 weights (to bf16
rounding) and exactly the same history, other columns and slots untouched, empty rows skipped; calls the C++ op
cannot serve stay with the loop."""

import pytest
import torch

from tests.patches.test_cpu_isa import BF16_DOT, HOSTS, force_host

G = pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention")

from luce_cpu_speedups import gdn_prefill_conv as P  # noqa: E402

DIM, WIDTH, K = 384, 4, 15
ORIGINAL = getattr(G.causal_conv1d_torch, "__wrapped__", G.causal_conv1d_torch)


def case(g, lens, slots, initial):
    weight, bias = torch.randn(DIM, WIDTH, generator=g).bfloat16(), torch.randn(DIM, generator=g).bfloat16()
    buffers = torch.randn(9, WIDTH - 1 + K, DIM, generator=g).bfloat16().transpose(1, 2)  # SD layout's view
    qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    x = torch.randn(int(qsl[-1]), DIM, generator=g).bfloat16().transpose(0, 1)  # as vLLM passes it
    return dict(x=x, weight=weight, bias=bias, conv_states=buffers, query_start_loc=qsl,
                cache_indices=torch.tensor(slots, dtype=torch.int32), has_initial_state=torch.tensor(initial))


@pytest.mark.parametrize("kind", HOSTS)
def test_prompt_conv_matches_vllms_torch_loop_on_the_wide_buffer(monkeypatch, kind):
    calls = force_host(monkeypatch, kind)
    g = torch.Generator().manual_seed(0)
    args = case(g, [5, 17, 1, 0, 9], [3, 7, 1, 2, 5], [True, False, True, True, False])
    before = args["conv_states"].clone()
    loop_weights = []

    def loop(x, weight, bias, *rest, **kwargs):
        loop_weights.append((weight.dtype, bias.dtype))
        return ORIGINAL(x, weight, bias, *rest, **kwargs)

    ours_states, vllms_states = before.clone(), before.clone()
    ours = P._make_wrapper(loop)(**{**args, "conv_states": ours_states}, activation="silu")
    vllms = ORIGINAL(**{**args, "conv_states": vllms_states}, activation="silu")
    if kind in BF16_DOT:  # the C++ op, on the history columns of the buffer, plain weights
        assert loop_weights == [] and [name for name, _ in calls] == ["_causal_conv1d_fwd_cpu"]
        handed = calls[0][1]
        assert handed["conv_states"].shape[-1] == WIDTH - 1 and handed["is_weight_packed"] is False
        assert handed["conv_states"].data_ptr() == ours_states.data_ptr() and handed["weight"] is args["weight"]
    else:  # the loop, convolving in float32 (the bf16 inputs convert exactly)
        assert loop_weights == [(torch.float32, torch.float32)] and calls == []
    assert ours.dtype == torch.bfloat16 and torch.isfinite(ours.float()).all()
    torch.testing.assert_close(ours.float(), vllms.float(), rtol=2e-2, atol=4e-2)
    assert torch.equal(ours_states, vllms_states)  # the history is the inputs themselves
    assert torch.equal(ours_states[:, :, WIDTH - 1:], before[:, :, WIDTH - 1:])  # the wide columns
    for untouched in (0, 2, 4, 6, 8):  # 2: an empty prompt
        assert torch.equal(ours_states[untouched], before[untouched])


@pytest.mark.parametrize("kind", HOSTS)
def test_calls_the_c_op_cannot_serve_go_to_vllms_loop(monkeypatch, kind):
    calls = force_host(monkeypatch, kind)
    g = torch.Generator().manual_seed(1)
    loop = []
    wrapper = P._make_wrapper(lambda *a, **k: loop.append(1))
    args = case(g, [3], [4], [True])
    wrapper(**{**args, "cache_indices": None})
    wrapper(**{**args, "x": args["x"].contiguous()})  # not the transposed view vLLM passes
    wrapper(**args, pad_slot_id=-7)
    wrapper(**args, activation="gelu")
    wrapper(**{**args, "cache_indices": torch.tensor([-1], dtype=torch.int32)})  # a padded row: the C++ op would
    assert len(loop) == 5 and calls == []  # write before the buffer (heap corruption, seen here), vLLM's loop skips it
