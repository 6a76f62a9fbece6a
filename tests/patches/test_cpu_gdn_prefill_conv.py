"""The prompt conv of a speculating engine's CPU Gated DeltaNet through vLLM's C++ op: the same outputs
(to bf16 rounding) and exactly the same history in the wide buffer's first width - 1 columns as vLLM's
torch loop, other columns and slots untouched, empty rows skipped; calls with padded rows stay with the
loop."""

import pytest
import torch

G = pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention")

from vllm_luce.patches import cpu_gdn_prefill_conv as P  # noqa: E402
from vllm_luce.patches.cpu_gdn_spec import cpp_conv_supported  # noqa: E402

DIM, WIDTH, K = 384, 4, 15


def case(g, lens, slots, initial):
    weight, bias = torch.randn(DIM, WIDTH, generator=g).bfloat16(), torch.randn(DIM, generator=g).bfloat16()
    buffers = torch.randn(9, WIDTH - 1 + K, DIM, generator=g).bfloat16().transpose(1, 2)  # SD layout's view
    qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    x = torch.randn(int(qsl[-1]), DIM, generator=g).bfloat16().transpose(0, 1)  # as vLLM passes it
    return dict(x=x, weight=weight, bias=bias, conv_states=buffers, query_start_loc=qsl,
                cache_indices=torch.tensor(slots, dtype=torch.int32), has_initial_state=torch.tensor(initial))


@pytest.mark.skipif(not cpp_conv_supported(), reason="vLLM's C++ conv needs bf16 dot products")
def test_prompt_conv_matches_vllms_torch_loop_on_the_wide_buffer():
    g = torch.Generator().manual_seed(0)
    args = case(g, [5, 17, 1, 0, 9], [3, 7, 1, 2, 5], [True, False, True, True, False])
    original = getattr(G.causal_conv1d_torch, "__wrapped__", G.causal_conv1d_torch)
    before = args["conv_states"].clone()
    ours_states, vllms_states = before.clone(), before.clone()
    ours = P._make_wrapper(original)(**{**args, "conv_states": ours_states}, activation="silu")
    vllms = original(**{**args, "conv_states": vllms_states}, activation="silu")
    assert torch.isfinite(ours.float()).all()
    torch.testing.assert_close(ours.float(), vllms.float(), rtol=2e-2, atol=4e-2)
    assert torch.equal(ours_states, vllms_states)
    assert torch.equal(ours_states[:, :, WIDTH - 1:], before[:, :, WIDTH - 1:])  # the wide columns
    for untouched in (0, 2, 4, 6, 8):  # 2: an empty prompt
        assert torch.equal(ours_states[untouched], before[untouched])


def test_calls_the_c_op_cannot_serve_go_to_vllms_loop():
    g = torch.Generator().manual_seed(1)
    calls = []
    wrapper = P._make_wrapper(lambda *a, **k: calls.append(1))
    args = case(g, [3], [4], [True])
    wrapper(**{**args, "cache_indices": None})
    wrapper(**{**args, "x": args["x"].contiguous()})  # not the transposed view vLLM passes
    wrapper(**args, pad_slot_id=-7)
    wrapper(**args, activation="gelu")
    wrapper(**{**args, "cache_indices": torch.tensor([-1], dtype=torch.int32)})  # a padded row: the C++ op would
    assert len(calls) == 5  # write before the buffer (heap corruption, seen here), vLLM's loop skips it


@pytest.mark.skipif(cpp_conv_supported(), reason="only CPUs without bf16 dot products convolve in float32")
def test_without_bf16_dot_products_the_loop_convolves_in_float32():
    g = torch.Generator().manual_seed(2)
    args = case(g, [5, 17, 1, 0, 9], [3, 7, 1, 2, 5], [True, False, True, True, False])
    original = getattr(G.causal_conv1d_torch, "__wrapped__", G.causal_conv1d_torch)
    seen = []

    def spy(x, weight, bias, *rest, **kwargs):
        seen.append((weight.dtype, bias.dtype))
        return original(x, weight, bias, *rest, **kwargs)

    ours_states, vllms_states = args["conv_states"].clone(), args["conv_states"].clone()
    ours = P._make_wrapper(spy)(**{**args, "conv_states": ours_states}, activation="silu")
    vllms = original(**{**args, "conv_states": vllms_states}, activation="silu")
    assert seen == [(torch.float32, torch.float32)]
    assert ours.dtype == torch.bfloat16 and torch.isfinite(ours.float()).all()
    torch.testing.assert_close(ours.float(), vllms.float(), rtol=2e-2, atol=4e-2)
    assert torch.equal(ours_states, vllms_states)  # the history is the inputs themselves
