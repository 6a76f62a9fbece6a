"""The general conv-history roll of the CPU Gated DeltaNet speculative patch (pure torch).

Each step verifies a different number of inputs and accepts a different number of them; every
output must equal a plain causal convolution over the accepted stream plus the step's inputs."""

import pytest
import torch

from vllm_luce.patches.cpu_gdn_spec import _per_request, roll_conv_and_convolve


def reference(stream: list[torch.Tensor], new: torch.Tensor, weight, bias) -> torch.Tensor:
    width = weight.shape[-1]
    seq = torch.stack(stream[-(width - 1):] + list(new), dim=-1)  # [dim, width - 1 + q]
    y = torch.nn.functional.conv1d(seq.unsqueeze(0), weight.unsqueeze(1), bias, groups=weight.shape[0])[0]
    return torch.nn.functional.silu(y).transpose(0, 1)


def test_variable_draft_counts_match_a_plain_causal_conv():
    g = torch.Generator().manual_seed(0)
    dim, width, k = 5, 4, 6
    state_len = width - 2 + 1 + k
    weight, bias = torch.randn(dim, width, generator=g), torch.randn(dim, generator=g)
    buffers = torch.full((3, dim, state_len), float("nan"))  # slot 1 is ours; NaN anywhere read wrongly shows
    stream = [torch.randn(dim, generator=g) for _ in range(width - 1)]
    buffers[1, :, : width - 1] = torch.stack(stream, dim=-1)  # what prefill leaves
    accepted = 1
    plan = [(7, 3), (1, 1), (7, 7), (2, 1), (4, 4), (1, 1), (1, 1), (7, 2), (3, 3)]  # (inputs q, accepted a)
    for q, a in plan:
        x = torch.randn(q, dim, generator=g)
        out = roll_conv_and_convolve(buffers, torch.tensor([1]), torch.tensor([accepted]), torch.tensor([0]),
                                     torch.tensor([q]), x, weight, bias, silu=True)
        torch.testing.assert_close(out, reference(stream, x, weight, bias))
        assert torch.isfinite(out).all()
        stream += list(x[:a])
        accepted = a


def test_requests_are_independent_and_empty_ones_untouched():
    g = torch.Generator().manual_seed(1)
    dim, width, state_len = 3, 4, 8
    weight = torch.randn(dim, width, generator=g)
    buffers = torch.randn(4, dim, state_len, generator=g)
    before = buffers.clone()
    x = torch.randn(5, dim, generator=g)
    out = roll_conv_and_convolve(buffers, torch.tensor([2, 0, 3]), torch.tensor([1, 2, 1]),
                                 torch.tensor([0, 3, 3]), torch.tensor([3, 0, 2]), x, weight, None, silu=False)
    assert torch.equal(buffers[0], before[0]) and torch.equal(buffers[1], before[1])  # slot 0: q == 0
    stream2 = list(before[2, :, :3].unbind(-1))
    y = torch.nn.functional.conv1d(torch.stack(stream2 + list(x[:3]), -1)[None], weight[:, None], groups=dim)[0]
    torch.testing.assert_close(out[:3], y.transpose(0, 1))


def test_uniform_batch_matches_the_per_request_roll():
    """Plain steps (q = 1 for every request) take the batched path; it must equal the loop."""
    g = torch.Generator().manual_seed(2)
    dim, width, state_len, n = 6, 4, 9, 5
    weight, bias = torch.randn(dim, width, generator=g), torch.randn(dim, generator=g)
    base = torch.randn(8, dim, state_len, generator=g)
    slots, accepted = torch.tensor([3, 0, 6, 1, 7]), torch.tensor([1, 4, 2, 7, 1])
    for q in (1, 3):
        x = torch.randn(n * q, dim, generator=g)
        starts, lengths = torch.arange(n) * q, torch.full((n,), q)
        batched, looped = base.clone(), base.clone()
        out_b = roll_conv_and_convolve(batched, slots, accepted, starts, lengths, x, weight, bias, silu=True)
        out_l = _per_request(looped, slots, accepted, starts, lengths, x, weight, bias, silu=True)
        torch.testing.assert_close(out_b, out_l)
        torch.testing.assert_close(batched, looped)


@pytest.mark.parametrize("conv", ["torch", "cpp"])
def test_plain_steps_through_a_plain_decode_conv_match_the_general_roll(conv):
    """q = 1 for every request: realign rows that accepted drafts, then the conv a plain decode runs
    (vLLM's torch decode conv, or its C++ one where the CPU has bf16 dot products), on a strided
    buffer as vLLM's SD conv-state layout gives; equal to the roll."""
    G = pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention")
    from vllm_luce.patches.cpu_gdn_spec import DecodeConv, PackedDecodeConv, cpp_conv_supported, plain_step_conv

    if conv == "cpp" and not cpp_conv_supported():
        pytest.skip("vLLM uses its C++ conv only on CPUs with bf16 dot products")
    g = torch.Generator().manual_seed(3)
    dim, width, state_len, n = 64, 4, 19, 5
    weight, bias = torch.randn(dim, width, generator=g).bfloat16(), torch.randn(dim, generator=g).bfloat16()
    base = torch.randn(8, state_len, dim, generator=g).bfloat16().transpose(1, 2)  # [slots, dim, state_len] view
    slots, accepted = torch.tensor([3, 5, 6, 1, 7]), torch.tensor([1, 4, 2, 16, 1])  # slot 0 is vLLM's null block
    x = torch.randn(n, dim, generator=g).bfloat16()
    fast, general = base.clone(), base.float()
    slots_i32 = slots.to(torch.int32)
    convolve = (DecodeConv(G.causal_conv1d_update_cpu, weight, bias, "silu", slots_i32) if conv == "torch" else
                PackedDecodeConv(G._causal_conv1d_update_cpu, weight, bias, True, slots_i32, width, packed=False))
    out = plain_step_conv(fast, slots, accepted, x, convolve)
    want = roll_conv_and_convolve(general, slots, accepted, torch.arange(n), torch.ones(n, dtype=torch.long),
                                  x.float(), weight.float(), bias.float(), silu=True)
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=5e-2)  # bf16 output rounding
    for s in slots.tolist():  # the history the next step reads, exactly
        assert torch.equal(fast[s, :, : width - 1], general[s, :, : width - 1].bfloat16())
    assert torch.equal(fast[2], base[2]) and torch.equal(fast[4], base[4])  # other slots untouched
