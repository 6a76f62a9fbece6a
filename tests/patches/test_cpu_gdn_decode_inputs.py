"""vLLM's CPU recurrent decode op stops on q/k/v strided in their last dimension; the wrapped op gives the
values the contiguous inputs give."""

import pytest
import torch

ops = pytest.importorskip("vllm._custom_ops")
if not hasattr(torch.ops._C, "fused_sigmoid_gating_delta_rule_update_cpu"):
    pytest.skip("vLLM's CPU ops are not built here", allow_module_level=True)

from vllm_luce.patches.cpu_gdn_decode_inputs import _make_wrapper  # noqa: E402

# vLLM's own op, also where an earlier test in this process applied the patches
vllm_op = getattr(ops.fused_sigmoid_gating_delta_rule_update_cpu, "__wrapped__",
                  ops.fused_sigmoid_gating_delta_rule_update_cpu)

T, H, K = 3, 2, 128


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*s, dtype=torch.bfloat16):
        return torch.randn(*s, generator=g).to(dtype)

    return dict(A_log=r(H), dt_bias=r(H), q=r(1, T, H, K), k=r(1, T, H, K), v=r(1, T, H, K), a=r(T, H), b=r(T, H),
                initial_state_source=r(4, H, K, K, dtype=torch.float32),
                initial_state_indices=torch.tensor([0, 2, 3], dtype=torch.int32),
                cu_seqlens=torch.tensor([0, 1, 2, 3], dtype=torch.int32), use_qk_l2norm_in_kernel=True)


def strided(t):
    """The same values, last dimension strided (as the torch conv's output split into q, k, v)."""
    return t.transpose(1, 3).contiguous().transpose(1, 3)


def test_strided_inputs_stop_vllms_op_and_the_wrapped_op_gives_the_contiguous_result():
    """Strided q, k, v and state indices (what vLLM's non-speculative decode in a speculating engine passes)."""
    want_in = inputs()
    want = vllm_op(**want_in)
    got_in = inputs()
    table = torch.zeros(3, 16, dtype=torch.int32)
    table[:, 0] = got_in["initial_state_indices"]  # vLLM passes column 0 of the speculative index table
    got_in.update(q=strided(got_in["q"]), k=strided(got_in["k"]), v=strided(got_in["v"]),
                  initial_state_indices=table[:, 0])
    assert got_in["q"].stride(-1) != 1 and got_in["initial_state_indices"].stride(-1) == 16
    with pytest.raises(RuntimeError, match="contiguous at last dimension"):
        vllm_op(**{**got_in, "initial_state_source":
                                                         got_in["initial_state_source"].clone()})
    got = _make_wrapper(vllm_op)(**got_in)
    assert torch.equal(got, want)
    assert torch.equal(got_in["initial_state_source"], want_in["initial_state_source"])  # the states it updated


def test_a_one_row_index_column_gets_unit_stride():
    """``contiguous()`` keeps a size-1 dimension's stride; the op rejects it (a batch of one decode row)."""
    from vllm_luce.patches.cpu_gdn_decode_inputs import last_dim_contiguous

    column = torch.arange(16, dtype=torch.int32).view(1, 16)[:, 0]
    assert column.contiguous().stride() == (16,)
    fixed = last_dim_contiguous(column)
    assert fixed.stride() == (1,) and torch.equal(fixed, column)
