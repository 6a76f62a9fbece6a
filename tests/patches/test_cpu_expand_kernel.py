"""The CPU expand-kernel patch: the rejection sampler's per-token temperature, top-k and top-p are the
request's values, in their own dtype (vLLM's CPU kernel left float32 and int32 outputs unwritten)."""

import pytest
import torch

from vllm_luce.patches.cpu_expand_kernel import expand_to_tokens


def naive(values, cu, replace_from, replace_to):
    out, start = [], 0
    for value, end in zip(values.tolist(), cu.tolist()):
        out += [replace_to if value == replace_from else value] * (end - start)
        start = end
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_matches_a_per_request_loop(dtype):
    g = torch.Generator().manual_seed(0)
    counts = torch.tensor([3, 0, 1, 5, 0, 2])  # requests with no drafts get no tokens
    cu = counts.cumsum(0).to(torch.int32)
    values = (torch.rand(6, generator=g) * 4).to(dtype)
    values[1] = values[4] = 0  # replaced
    out = torch.full((int(cu[-1]),), -7, dtype=dtype)
    expand_to_tokens(out, values, cu, 0, 1)
    assert out.tolist() == pytest.approx(naive(values, cu, 0, 1))


@pytest.fixture(scope="module")
def rejection_sampler():
    import vllm_luce

    vllm_luce.register()
    from vllm.platforms import current_platform

    from vllm_luce.patches import cpu_expand_kernel

    cpu_expand_kernel.apply()  # normally when the worker's kernel registration imports cpu_triton_utils
    current_platform.register_triton_kernel_overrides()  # what each CPU worker does after loading plugins
    from vllm.v1.sample import rejection_sampler

    return rejection_sampler


def test_vllm_expands_float_temperatures_through_the_patch(rejection_sampler):
    temperature = torch.tensor([0.0, 0.8, 0.0, 1.3])  # greedy rows are 0 and become 1
    cu = torch.tensor([2, 4, 4, 7], dtype=torch.int32)
    for _ in range(3):  # vLLM's kernel returned leftover memory, different from call to call
        got = rejection_sampler.expand_batch_to_tokens(temperature, cu, 7, replace_from=0, replace_to=1)
        assert got.tolist() == pytest.approx([1.0, 1.0, 0.8, 0.8, 1.3, 1.3, 1.3])


def test_int64_values_keep_vllms_kernel(rejection_sampler):
    from vllm.utils import cpu_triton_utils

    values, cu = torch.tensor([4, 0, 9]), torch.tensor([1, 3, 4])
    out = torch.empty(4, dtype=torch.int64)
    cpu_triton_utils._expand_kernel_impl.__wrapped__(out, values, cu, 0, 5)
    assert out.tolist() == [4, 5, 5, 9]
