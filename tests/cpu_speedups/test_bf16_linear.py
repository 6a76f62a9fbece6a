"""bf16 linear layers on CPUs without bf16 dot products compute through a float32 copy of the weight: the same
result as vLLM's bf16 path to bf16 rounding; the bf16 weight released only where vLLM's prepacked paths release
it; other dtypes, shapes and large weights left to vLLM's dispatch."""

import pytest
import torch

pytest.importorskip("vllm.model_executor.layers.utils")

from luce_cpu_speedups import bf16_linear as P  # noqa: E402


class Layer(torch.nn.Module):
    def __init__(self, out_features, in_features, dtype=torch.bfloat16, bias=True):
        super().__init__()
        g = torch.Generator().manual_seed(out_features)
        self.weight = torch.nn.Parameter(torch.randn(out_features, in_features, generator=g).to(dtype), False)
        self.bias = torch.nn.Parameter(torch.randn(out_features, generator=g).to(dtype), False) if bias else None


@pytest.mark.parametrize("rows,bias", [(1, True), (17, False), (300, True)])
def test_float32_path_equals_the_bf16_linear_to_rounding(rows, bias):
    layer = Layer(95, 131, bias=bias)
    weight, b = layer.weight.detach().clone(), None if layer.bias is None else layer.bias.detach().clone()
    calls = []
    P._make_wrapper(lambda *a: calls.append(a))(layer, True)
    assert calls == [] and layer.weight.numel() == 0  # released, as vLLM's prepacked paths do
    x = torch.randn(rows, 131, generator=torch.Generator().manual_seed(rows)).bfloat16()
    out = layer.cpu_linear(x, layer.weight, layer.bias)
    ref = torch.nn.functional.linear(x.double(), weight.double(), None if b is None else b.double())
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 95) and torch.isfinite(out.float()).all()
    torch.testing.assert_close(out.double(), ref, atol=0.0, rtol=8e-3)  # one bf16 rounding of the float32 sum


def test_the_weight_is_kept_where_vllm_keeps_it():
    layer = Layer(8, 16, bias=False)
    P._make_wrapper(lambda *a: None)(layer, False)  # vocabulary embeddings: the lookup reads the weight
    assert layer.weight.shape == (8, 16)


def test_other_layers_go_to_vllms_dispatch():
    calls = []
    wrapper = P._make_wrapper(lambda layer, remove: calls.append(layer))
    for layer in (Layer(8, 16, dtype=torch.float32), Layer(8, 16, dtype=torch.float16)):
        wrapper(layer, True)
    conv = Layer(8, 16)
    conv.weight = torch.nn.Parameter(torch.zeros(8, 1, 4, dtype=torch.bfloat16), False)
    wrapper(conv, True)
    big = Layer(1, 1)
    big.weight = torch.nn.Parameter(torch.empty(P.MAX_FP32_WEIGHT_BYTES // 4 + 1, 1, dtype=torch.bfloat16), False)
    wrapper(big, True)
    assert len(calls) == 4 and not any(hasattr(layer, "cpu_linear") for layer in calls)
