"""The DFlash drafter's context K/V projection in float32 on CPUs without bf16 dot products: vLLM's own
``_project_context_kv`` returns the same K/V as through its fused bf16 GEMM, to bf16 rounding, once the
buffers are built by the patched method; drafter classes with their own projection and weights that stay
bf16 keep vLLM's fused path."""

from types import SimpleNamespace

import pytest
import torch

qwen3_dflash = pytest.importorskip("vllm.model_executor.models.qwen3_dflash")

from vllm.model_executor.layers.linear import UnquantizedLinearMethod  # noqa: E402

from luce_cpu_speedups import dflash_context_kv as P  # noqa: E402

M = qwen3_dflash.DFlashQwen3Model
ORIGINAL = getattr(M._build_context_kv_buffers, "__wrapped__", M._build_context_kv_buffers)
LAYERS, KV_HEADS, HEAD_DIM, HIDDEN, Q_SIZE = 3, 3, 16, 80, 48


class Drafter(SimpleNamespace):
    """What the two methods read of a DFlashQwen3Model."""

    _project_context_kv = M._project_context_kv


class OwnProjection(Drafter):
    def _project_context_kv(self, *args):
        raise AssertionError("not called here")


def drafter(cls=Drafter, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    attn = []
    for _ in range(LAYERS):
        w = (torch.randn(Q_SIZE + 2 * KV_HEADS * HEAD_DIM, HIDDEN, generator=g) / HIDDEN ** 0.5).bfloat16()
        b = torch.randn(w.shape[0], generator=g).bfloat16() if bias else None
        attn.append(SimpleNamespace(qkv_proj=SimpleNamespace(weight=w, bias=b, quant_method=UnquantizedLinearMethod()),
                                    q_size=Q_SIZE, k_norm=SimpleNamespace(weight=torch.ones(HEAD_DIM).bfloat16())))
    norm = SimpleNamespace(weight=(torch.rand(HIDDEN, generator=g) + 0.5).bfloat16())
    return cls(hidden_norm=norm, _rms_norm_eps=1e-6), attn


def patched_build(model, attn, bias):
    P._make_wrapper(ORIGINAL, M._project_context_kv)(model, attn, bias)


@pytest.mark.parametrize("tokens,bias", [(1, True), (37, False), (300, True)])
def test_float32_projection_equals_vllms_fused_bf16_gemm_to_rounding(tokens, bias):
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(tokens)).bfloat16()
    fused, attn = drafter(bias=bias)
    ORIGINAL(fused, attn, bias)
    ref_k, ref_v = M._project_context_kv(fused, x, tokens, LAYERS, KV_HEADS, HEAD_DIM)
    model, attn = drafter(bias=bias)
    patched_build(model, attn, bias)
    assert model._fused_kv_weight is None and model._context_q_sizes == [0] * LAYERS
    k, v = M._project_context_kv(model, x, tokens, LAYERS, KV_HEADS, HEAD_DIM)
    for got, ref in ((k, ref_k), (v, ref_v)):
        assert got.dtype == torch.bfloat16 and got.shape == ref.shape == (LAYERS, tokens, KV_HEADS, HEAD_DIM)
        assert torch.isfinite(got.float()).all()
        torch.testing.assert_close(got.float(), ref.float(), atol=1e-2, rtol=1.6e-2)  # each rounds once to bf16
    # Exact up to one bf16 rounding of the float32 sum, against float64 over the same bf16 normalised input.
    normed = torch.empty_like(x)
    qwen3_dflash.ops.rms_norm(normed, x, fused._hidden_norm_weight, 1e-6)
    kv = torch.nn.functional.linear(normed.double(), fused._fused_kv_weight.double(),
                                    None if fused._fused_kv_bias is None else fused._fused_kv_bias.double())
    kv = kv.view(tokens, LAYERS, 2, KV_HEADS, HEAD_DIM).permute(2, 1, 0, 3, 4)
    torch.testing.assert_close(k.double(), kv[0], atol=1e-6, rtol=8e-3)
    torch.testing.assert_close(v.double(), kv[1], atol=1e-6, rtol=8e-3)


def test_a_drafter_with_its_own_projection_keeps_vllms_buffers():
    model, attn = drafter(OwnProjection)
    patched_build(model, attn, True)
    assert model._fused_kv_weight is not None and model._context_q_sizes == [Q_SIZE] * LAYERS


def test_weights_that_stay_bf16_keep_vllms_fused_path(monkeypatch):
    monkeypatch.setattr(P, "upcast", lambda weight: False)  # e.g. a layer over the float32 copy's size limit
    model, attn = drafter()
    patched_build(model, attn, True)
    assert model._fused_kv_weight is not None


def test_a_fused_weight_that_does_not_split_into_layers_is_left_alone():
    assert P.float32_projections(torch.zeros(7, 4, dtype=torch.bfloat16), None, 3) is None
