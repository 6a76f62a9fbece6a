"""The conv-history roll of the CPU Gated DeltaNet speculative patch.

Each step verifies a different number of inputs and accepts a different number of them; every
output must equal a plain causal convolution over the accepted stream plus the step's inputs: the
general roll (pure torch), plain steps through the plain engine's decode conv, and every kind of step
through the patched ``_spec_forward`` on every host kind (``test_cpu_isa.force_host``)."""

from types import SimpleNamespace

import pytest
import torch

from tests.patches.test_cpu_isa import BF16_DOT, HOSTS, GdnLayer, force_host, loaded_conv1d
from vllm_luce.patches import cpu_gdn_spec as S
from vllm_luce.patches.cpu_gdn_spec import _per_request, roll_conv_and_convolve

CPP, VEC = "_causal_conv1d_update_cpu", "causal_conv1d_update_cpu"  # vLLM's C++ conv and its generic one


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


@pytest.mark.parametrize("kind", HOSTS)
@pytest.mark.parametrize("packed_at_load", [True, False])
def test_plain_steps_through_the_plain_engines_decode_conv_match_the_general_roll(monkeypatch, kind, packed_at_load):
    """q = 1 for every request: realign rows that accepted drafts, then the conv a plain decode runs (vLLM's C++
    one where the CPU has bf16 dot products, on the weights vLLM packed at load or, where it did not, on plain
    ones; its generic one elsewhere), on a strided buffer as vLLM's SD conv-state layout gives; equal to the roll."""
    pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention")
    calls = force_host(monkeypatch, kind)
    g = torch.Generator().manual_seed(3)
    dim, width, state_len, n = 64, 4, 19, 5
    weight, bias = torch.randn(dim, width, generator=g).bfloat16(), torch.randn(dim, generator=g).bfloat16()
    base = torch.randn(8, state_len, dim, generator=g).bfloat16().transpose(1, 2)  # [slots, dim, state_len] view
    slots, accepted = torch.tensor([3, 5, 6, 1, 7]), torch.tensor([1, 4, 2, 16, 1])  # slot 0 is vLLM's null block
    x = torch.randn(n, dim, generator=g).bfloat16()
    fast, general = base.clone(), base.float()
    conv1d = (loaded_conv1d(weight, bias) if packed_at_load
              else SimpleNamespace(weight=weight[:, None, :].clone(), bias=bias))
    convolve = S.plain_conv(SimpleNamespace(conv1d=conv1d, activation="silu"), slots.to(torch.int32))
    if kind in BF16_DOT:
        packed = hasattr(conv1d, "_cpu_unpacked_conv_weight")
        assert isinstance(convolve, S.PackedDecodeConv) and convolve.packed is packed is packed_at_load
        assert torch.equal(convolve.weight, conv1d.weight if packed else weight)
    else:
        assert isinstance(convolve, S.DecodeConv) and torch.equal(convolve.weight, weight)
    out = S.plain_step_conv(fast, slots, accepted, x, convolve)
    assert [name for name, _ in calls] == [CPP if kind in BF16_DOT else VEC]
    want = roll_conv_and_convolve(general, slots, accepted, torch.arange(n), torch.ones(n, dtype=torch.long),
                                  x.float(), weight.float(), bias.float(), silu=True)
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=5e-2)  # bf16 output rounding
    for s in slots.tolist():  # the history the next step reads, exactly
        assert torch.equal(fast[s, :, : width - 1], general[s, :, : width - 1].bfloat16())
    assert torch.equal(fast[2], base[2]) and torch.equal(fast[4], base[4])  # other slots untouched


HEADS, HEAD_DIM, K = 2, 64, 3


def Layer(g, width):  # noqa: N802 - a layer, as the tests read
    return GdnLayer(g, width, HEADS, HEAD_DIM)


@pytest.mark.parametrize("kind", HOSTS)
def test_every_kind_of_step_convolves_each_requests_accepted_stream(monkeypatch, kind):
    """Full verify steps (vLLM's code: its C++ verify conv on AMX and Arm bf16 hosts, its torch roll elsewhere),
    steps with fewer drafts (the general roll) and plain steps (the plain engine's decode conv) in any order
    leave each request's history where the next one reads it, on every host kind."""
    G = pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention")
    calls = force_host(monkeypatch, kind)
    g = torch.Generator().manual_seed(4)
    width, n = 4, 3
    state_len, full, dim = width - 1 + K, 1 + K, 3 * HEADS * HEAD_DIM
    layer = Layer(g, width)
    indices = torch.arange(1, 1 + n * full, dtype=torch.int32).view(n, full)  # slot 0 is vLLM's null block
    conv = torch.full((1 + n * full, state_len, dim), float("nan")).bfloat16().transpose(1, 2)  # SD layout's view
    conv[indices[:, 0].long(), :, : width - 1] = torch.randn(n, dim, width - 1, generator=g).bfloat16()  # prefill's
    ssm = torch.randn(1 + n * full, HEADS, HEAD_DIM, HEAD_DIM, generator=g) * 0.1
    streams = [list(conv[int(s), :, : width - 1].float().unbind(-1)) for s in indices[:, 0]]
    spec_forward = S._make_wrapper(getattr(G._spec_forward, "__wrapped__", G._spec_forward))
    cpp_verify = kind in ("amx", "arm_bf16")
    plan = [([4, 4, 4], [2, 4, 1]), ([2, 4, 1], [1, 3, 1]), ([1, 1, 1], [1, 1, 1]), ([4, 4, 4], [3, 1, 4]),
            ([1, 1, 1], [1, 1, 1]), ([3, 1, 2], [3, 1, 2]), ([4, 4, 4], [4, 2, 1]), ([4, 4, 4], [1, 1, 1])]
    accepted = [1] * n
    for lengths, next_accepted in plan:
        qsl = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        meta = SimpleNamespace(num_spec_decodes=n, spec_state_indices_tensor=indices, spec_query_start_loc=qsl,
                               num_accepted_tokens=torch.tensor(accepted, dtype=torch.int32))
        tokens = int(qsl[-1])
        x = torch.randn(tokens, dim, generator=g).bfloat16()
        a, b = torch.randn(tokens, HEADS, generator=g).bfloat16(), torch.randn(tokens, HEADS, generator=g).bfloat16()
        calls.clear()
        out = spec_forward(layer, meta, x, b, a, conv, ssm, width, state_len)
        if lengths == [full] * n:
            assert [name for name, _ in calls] == ([CPP] if cpp_verify else [])
        elif lengths == [1] * n:
            assert [name for name, _ in calls] == [CPP if kind in BF16_DOT else VEC]
        else:
            assert calls == []
        for i, (start, q) in enumerate(zip(qsl.tolist(), lengths)):
            new = x[start : start + q].float()
            seq = torch.stack(streams[i][-(width - 1):] + list(new), dim=-1).double()  # [dim, width - 1 + q]
            want = torch.nn.functional.silu(torch.nn.functional.conv1d(
                seq[None], layer.weight.double()[:, None], layer.conv1d.bias.double(), groups=dim)[0]).T
            torch.testing.assert_close(layer.seen[-1][start : start + q].double(), want, rtol=1e-2, atol=1e-2)
            streams[i] += list(new[: next_accepted[i]])
        assert torch.isfinite(out.float()).all()
        accepted = next_accepted
