"""The CPU patches' instruction-set branches, tested on every host kind whatever this host is (vllm-luce's here;
the test environment's speed-ups in tests/cpu_speedups/ force hosts with ``force_host`` too).

``force_host`` makes vLLM's detection (``torch.cpu``'s AVX512-BF16 and AMX tests, the platform's architecture and
capabilities behind ``is_arm_bf16``) and the product's ``cpp_conv_supported`` report a host kind. Where that kind
has bf16 dot products and this host has not, vLLM's C++ conv ops are replaced by the plain-torch equivalents
below, which the last tests here check against the real ops wherever this host has them. Measured with the real
ops on a wide speculative buffer: the decode and prompt convs read and roll only the buffer's first width - 1
columns, and the verify conv leaves the layout vLLM's torch verify roll leaves (so on AMX hosts vLLM's own
paths and the product's agree on where each row's history is)."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

G = pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention")

from vllm.platforms import CpuArchEnum, current_platform  # noqa: E402

from vllm_luce.patches import cpu_gdn_spec as S  # noqa: E402

# (AVX512-BF16, AMX, Arm bf16) of each host kind; every AMX CPU also has AVX512-BF16.
HOSTS = {"avx2": (False, False, False), "avx512_bf16": (True, False, False), "amx": (True, True, False),
         "arm_bf16": (False, False, True)}
BF16_DOT = ("avx512_bf16", "amx", "arm_bf16")  # the kinds where vLLM packs conv weights and has its C++ conv
REAL_BF16_DOT = bool(torch.cpu._is_avx512_bf16_supported() or G.is_arm_bf16())  # this host, read before forcing
real_ops = pytest.mark.skipif(not REAL_BF16_DOT, reason="vLLM's C++ conv runs only on CPUs with bf16 dot products")
BLOCK_N = 32  # vLLM's conv weight pack: [dim, 4] -> [dim / 32, 2, 32, 2]


def pack_conv_weight(weight: torch.Tensor) -> torch.Tensor:
    """``ops.causal_conv1d_weight_pack`` in torch."""
    dim, width = weight.shape
    return weight.reshape(dim // BLOCK_N, BLOCK_N, width // 2, 2).permute(0, 2, 1, 3).contiguous().view(dim, width)


def unpack_conv_weight(packed: torch.Tensor) -> torch.Tensor:
    dim, width = packed.shape
    return packed.reshape(dim // BLOCK_N, width // 2, BLOCK_N, 2).permute(0, 2, 1, 3).reshape(dim, width)


def _conv(seq: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool) -> torch.Tensor:
    """Causal depthwise conv of seq [dim, width - 1 + q] in float32: [dim, q]."""
    y = F.conv1d(seq.float()[None], weight.float()[:, None], None if bias is None else bias.float(),
                 groups=weight.shape[0])[0]
    return F.silu(y) if silu else y


def conv1d_update(*, x, conv_states, weight, bias, silu_activation, conv_state_indices, is_weight_packed,
                  num_accepted_tokens=None):
    """``gdn_attention._causal_conv1d_update_cpu`` (decode: x [n, dim]; verify: x [n, q, dim] with
    ``num_accepted_tokens``) on a buffer of any width: a row's history is the width - 1 columns from column
    accepted - 1 (0 for decode); decode rolls those columns, verify leaves what vLLM's torch verify roll does."""
    assert x.is_contiguous() and weight.is_contiguous() and conv_states.stride(1) == 1  # what the op reads in place
    assert x.dtype == weight.dtype == conv_states.dtype == torch.bfloat16
    assert conv_state_indices.dtype == torch.int32 and conv_state_indices.is_contiguous()
    assert len(conv_state_indices) == x.shape[0]
    weight = unpack_conv_weight(weight) if is_weight_packed else weight
    width, state_len = weight.shape[-1], conv_states.shape[-1]
    rows = x.view(x.shape[0], -1, x.shape[-1])
    out = torch.empty_like(rows)
    for i, new in enumerate(rows.transpose(1, 2)):  # new [dim, q]
        buf = conv_states[int(conv_state_indices[i])]
        offset = 0 if num_accepted_tokens is None else int(num_accepted_tokens[i]) - 1
        seq = torch.cat([buf[:, offset : offset + width - 1], new], dim=-1)
        out[i] = _conv(seq, weight, bias, silu_activation).transpose(0, 1).to(x.dtype)
        if num_accepted_tokens is None:
            buf[:, : width - 1] = seq[:, -(width - 1):]
        else:
            buf.copy_(torch.cat([buf[:, offset + 1 : offset + 1 + state_len - new.shape[1]], new], dim=-1))
    return out.view_as(x)


def conv1d_fwd(*, x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
               silu_activation, is_weight_packed):
    """``gdn_attention._causal_conv1d_fwd_cpu`` (prompts, x the transposed [dim, tokens] view) on a buffer of
    any width: each row's history is read from, and its last width - 1 inputs written to, the first width - 1
    columns; empty rows are skipped."""
    assert x.dim() == 2 and x.stride(0) == 1 and conv_states.stride(1) == 1 and weight.is_contiguous()
    assert cache_indices.dtype == torch.int32 and query_start_loc.dtype == torch.int32
    weight = unpack_conv_weight(weight) if is_weight_packed else weight
    width = weight.shape[-1]
    out = torch.empty_like(x)
    bounds = query_start_loc.tolist()
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if start == end:
            continue
        buf = conv_states[int(cache_indices[i])]
        history = buf[:, : width - 1] if bool(has_initial_state[i]) else torch.zeros_like(buf[:, : width - 1])
        seq = torch.cat([history, x[:, start:end]], dim=-1)
        out[:, start:end] = _conv(seq, weight, bias, silu_activation).to(x.dtype)
        buf[:, : width - 1] = seq[:, -(width - 1):]
    return out


def _spy(name, op, calls):
    def call(*args, **kwargs):
        calls.append((name, kwargs))
        return op(*args, **kwargs)

    return call


def force_host(monkeypatch, kind: str) -> list:
    """Detection reports host ``kind`` until the test ends; vLLM's conv ops (C++ ones replaced where this host
    lacks them) record their calls, as (name, kwargs), in the list returned."""
    avx512, amx, arm = HOSTS[kind]
    S.cpp_conv_supported()  # this host's answer cached first: wrappers bound to the original keep it
    # vLLM's kernel library is loaded by now (G imports it); choosing it again under a forced kind would load a
    # second one, which aborts the process, so every later import of vLLM keeps it.
    monkeypatch.setattr(type(current_platform), "import_kernels", classmethod(lambda cls: None))
    capabilities = {**torch.cpu.get_capabilities(), "bf16": arm}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: capabilities)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(current_platform, "get_cpu_architecture",
                        lambda: CpuArchEnum.ARM if arm else CpuArchEnum.X86)
    monkeypatch.setattr(S, "cpp_conv_supported", functools.cache(S.cpp_conv_supported.__wrapped__))
    fake = kind in BF16_DOT and not REAL_BF16_DOT
    if fake:
        monkeypatch.setattr(G.ops, "causal_conv1d_weight_pack", pack_conv_weight)
    calls = []
    for name, op in (("_causal_conv1d_update_cpu", conv1d_update if fake else G._causal_conv1d_update_cpu),
                     ("_causal_conv1d_fwd_cpu", conv1d_fwd if fake else G._causal_conv1d_fwd_cpu),
                     ("causal_conv1d_update_cpu", G.causal_conv1d_update_cpu)):
        monkeypatch.setattr(G, name, _spy(name, op, calls))
    return calls


def loaded_conv1d(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.nn.Module:
    """A GDN layer's conv1d (weight [dim, width]) as vLLM's load leaves it on the forced host: on kinds with
    bf16 dot products the weight packed and the plain one kept as ``_cpu_unpacked_conv_weight``."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    conv1d = torch.nn.Module()
    conv1d.weight = torch.nn.Parameter(weight[:, None, :].clone(), requires_grad=False)
    conv1d.bias = None if bias is None else torch.nn.Parameter(bias.clone(), requires_grad=False)
    dispatch_cpu_unquantized_gemm(conv1d, False)
    return conv1d


class GdnLayer(torch.nn.Module):
    """What vLLM's CPU Gated DeltaNet paths read of a layer, its conv weight loaded as on the host in force; the
    conv outputs they hand on are recorded in ``seen``."""

    def __init__(self, g, width: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        dim = 3 * heads * head_dim
        self.weight = torch.randn(dim, width, generator=g).bfloat16()
        self.conv1d = loaded_conv1d(self.weight, torch.randn(dim, generator=g).bfloat16())
        self.activation = "silu"
        self.A_log = torch.randn(heads, generator=g)
        self.dt_bias = torch.randn(heads, generator=g).bfloat16()
        self.seen = []

    def rearrange_mixed_qkv(self, mixed_qkv):
        self.seen.append(mixed_qkv.clone())
        q, k, v = mixed_qkv.split(self.heads * self.head_dim, dim=-1)
        return (t.reshape(1, t.shape[0], self.heads, self.head_dim) for t in (q, k, v))


@pytest.mark.parametrize("kind", HOSTS)
def test_detection_follows_the_host_kind(monkeypatch, kind):
    force_host(monkeypatch, kind)
    assert S.cpp_conv_supported() is (kind in BF16_DOT) and G.is_arm_bf16() is (kind == "arm_bf16")
    assert torch.cpu._is_amx_tile_supported() is (kind == "amx")
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 4, generator=g).bfloat16()
    conv1d = loaded_conv1d(weight, None)
    assert hasattr(conv1d, "_cpu_unpacked_conv_weight") is (kind in BF16_DOT)
    assert torch.equal(G._unpacked_conv_weight(SimpleNamespace(conv1d=conv1d)), weight)


@real_ops
def test_the_torch_pack_is_vllms():
    w = torch.randn(384, 4, generator=torch.Generator().manual_seed(1)).bfloat16()
    packed = G.ops.causal_conv1d_weight_pack(w)
    assert torch.equal(pack_conv_weight(w), packed) and torch.equal(unpack_conv_weight(packed), w)


def _wide_case(seed, slots=6, width=4, k=15, dim=384):
    g = torch.Generator().manual_seed(seed)
    weight, bias = torch.randn(dim, width, generator=g).bfloat16(), torch.randn(dim, generator=g).bfloat16()
    buffers = torch.randn(slots, width - 1 + k, dim, generator=g).bfloat16().transpose(1, 2)  # SD layout's view
    return g, weight, bias, buffers


@real_ops
@pytest.mark.parametrize("packed", [True, False])
def test_the_torch_decode_conv_is_vllms_on_a_wide_buffer(packed):
    g, weight, bias, buffers = _wide_case(2)
    x = torch.randn(3, weight.shape[0], generator=g).bfloat16()
    args = dict(x=x, weight=pack_conv_weight(weight) if packed else weight, bias=bias, silu_activation=True,
                conv_state_indices=torch.tensor([4, 1, 3], dtype=torch.int32), is_weight_packed=packed)
    ours, real = buffers.clone(), buffers.clone()
    out = conv1d_update(conv_states=ours, **args)
    want = G._causal_conv1d_update_cpu(conv_states=real, **args)
    torch.testing.assert_close(out.float(), want.float(), rtol=1e-2, atol=1e-2)  # the op's bf16 rounding
    assert torch.equal(ours, real) and torch.equal(real[:, :, 3:], buffers[:, :, 3:])  # only columns 0-2 roll


@real_ops
def test_the_torch_verify_conv_is_vllms():
    g, weight, bias, buffers = _wide_case(3, k=3)
    n, q = 3, 4
    x = torch.randn(n, q, weight.shape[0], generator=g).bfloat16()
    args = dict(x=x, weight=pack_conv_weight(weight), bias=bias, silu_activation=True, is_weight_packed=True,
                conv_state_indices=torch.tensor([2, 5, 0], dtype=torch.int32),
                num_accepted_tokens=torch.tensor([1, 4, 2], dtype=torch.int32))
    ours, real = buffers.clone(), buffers.clone()
    out = conv1d_update(conv_states=ours, **args)
    want = G._causal_conv1d_update_cpu(conv_states=real, **args)
    torch.testing.assert_close(out.float(), want.float(), rtol=1e-2, atol=1e-2)
    assert torch.equal(ours, real)


@real_ops
def test_the_torch_prompt_conv_is_vllms_on_a_wide_buffer():
    g, weight, bias, buffers = _wide_case(4)
    qsl = torch.tensor([0, 5, 45, 46, 46, 48], dtype=torch.int32)
    x = torch.randn(48, weight.shape[0], generator=g).bfloat16().transpose(0, 1)
    args = dict(x=x, weight=pack_conv_weight(weight), bias=bias, query_start_loc=qsl, silu_activation=True,
                cache_indices=torch.tensor([1, 3, 4, 2, 5], dtype=torch.int32), is_weight_packed=True,
                has_initial_state=torch.tensor([True, False, True, True, False]))
    ours, real = buffers.clone(), buffers.clone()
    out = conv1d_fwd(conv_states=ours, **args)
    want = G._causal_conv1d_fwd_cpu(conv_states=real, **args)
    torch.testing.assert_close(out.float(), want.float(), rtol=1e-2, atol=1e-2)
    assert torch.equal(ours, real) and torch.equal(real[:, :, 3:], buffers[:, :, 3:])
