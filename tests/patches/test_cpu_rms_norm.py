"""The grouped-weight RMSNorm patch on CPU: each outermost slice gets its own weight row."""

import pytest
import torch


@pytest.fixture(scope="module")
def ops():
    import vllm_luce

    vllm_luce.register()
    from vllm import _custom_ops

    from vllm_luce.patches import cpu_rms_norm

    cpu_rms_norm.apply()  # normally on first import of vllm._custom_ops
    return _custom_ops


def test_grouped_weight_rows_apply_per_layer(ops):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 2, 64, generator=g).to(torch.bfloat16)
    w = (torch.rand(3, 64, generator=g) * 3).to(torch.bfloat16)
    out = torch.full_like(x, float("nan"))
    ops.rms_norm(out, x, w, 1e-6)
    ref = torch.stack([torch.nn.functional.rms_norm(x[i].float(), (64,), w[i].float(), 1e-6) for i in range(3)])
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_one_dimensional_weights_are_vllms_own_op(ops):
    x = torch.randn(5, 64).to(torch.bfloat16)
    w = torch.rand(64).to(torch.bfloat16)
    out, direct = torch.empty_like(x), torch.empty_like(x)
    ops.rms_norm(out, x, w, 1e-6)
    torch.ops._C.rms_norm(direct, x, w, 1e-6)
    assert torch.equal(out, direct)


def test_mismatched_groups_are_refused(ops):
    with pytest.raises(ValueError, match="one weight row per outermost index"):
        ops.rms_norm(torch.empty(2, 3, 64), torch.randn(2, 3, 64), torch.ones(3, 64), 1e-6)
