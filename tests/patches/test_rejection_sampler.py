"""The zero-draft fast path of V1's rejection sampler against vLLM's own path (CPU, no engine):
same tokens for greedy and seeded random requests, vLLM's path whenever a draft or log-probabilities
are in the step."""

import pytest
import torch

pytest.importorskip("vllm.v1.sample.rejection_sampler")


def sampling_metadata(batch: int, temperature: list[float], seeds: list[int | None], logprobs=None):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    gens = {i: torch.Generator().manual_seed(s) for i, s in enumerate(seeds) if s is not None}
    greedy = all(t == 0.0 for t in temperature)
    return SamplingMetadata(
        temperature=None if greedy else torch.tensor(temperature), all_greedy=greedy,
        all_random=all(t > 0 for t in temperature), top_p=None, top_k=None, generators=gens,
        max_num_logprobs=logprobs, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors(),
        spec_token_ids=[[] for _ in range(batch)])


def metadata(drafts: list[list[int]]):
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    meta = SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))
    starts = torch.tensor([0] + [len(d) + 1 for d in drafts]).cumsum(0)[:-1].tolist()
    meta.target_logits_indices = torch.tensor([s + j for s, d in zip(starts, drafts) for j in range(len(d))],
                                              dtype=torch.int32)
    meta.bonus_logits_indices = torch.tensor([s + len(d) for s, d in zip(starts, drafts)], dtype=torch.int32)
    return meta


@pytest.fixture(scope="module")
def samplers():
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    from vllm_luce.patches.rejection_sampler import _make_wrapper

    CpuPlatform.register_triton_kernel_overrides()  # what a CPU engine does at start: vLLM's CPU kernels
    plain = RejectionSampler(Sampler())
    fast = RejectionSampler(Sampler())
    original = RejectionSampler.forward
    return plain, fast, (lambda *a: original(plain, *a)), (lambda *a: _make_wrapper(original)(fast, *a))


@pytest.mark.parametrize("temperature,seeds", [([0.0] * 5, [None] * 5), ([0.8, 1.0, 0.7, 1.3, 0.9], [1, 2, 3, 4, 5])])
def test_no_drafts_gives_vllms_tokens(samplers, temperature, seeds):
    _, _, vllm_path, fast_path = samplers
    logits = torch.randn(5, 211, generator=torch.Generator().manual_seed(0))
    meta = metadata([[]] * 5)
    want = vllm_path(meta, None, logits.clone(), sampling_metadata(5, temperature, seeds))
    got = fast_path(meta, None, logits.clone(), sampling_metadata(5, temperature, seeds))
    assert got.sampled_token_ids.shape == (5, 1) and got.sampled_token_ids.dtype == torch.int32
    assert torch.equal(got.sampled_token_ids, want.sampled_token_ids)
    assert got.logprobs_tensors is None


def test_a_step_with_drafts_or_logprobs_takes_vllms_path(samplers):
    from vllm_luce.patches.rejection_sampler import bonus_only

    plain, _, _, _ = samplers
    greedy = sampling_metadata(3, [0.0] * 3, [None] * 3)
    assert bonus_only(metadata([[], [], []]), greedy, False)
    assert not bonus_only(metadata([[], [7], []]), greedy, False)
    assert not bonus_only(metadata([[], [], []]), sampling_metadata(3, [0.0] * 3, [None] * 3, logprobs=2), False)
    assert not bonus_only(metadata([[], [], []]), greedy, True)
    # A verified draft through the wrapper: vLLM's rejection sampling.
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    from vllm_luce.patches.rejection_sampler import _make_wrapper

    logits = torch.full((4, 50), -5.0)
    logits[0, 7] = logits[1, 9] = logits[2, 3] = logits[3, 4] = 5.0  # rows: r0 bonus, r1 draft + bonus, r2 bonus
    forward = _make_wrapper(RejectionSampler.forward)
    accepted = forward(plain, metadata([[], [9], []]), None, logits.clone(), greedy)
    assert accepted.sampled_token_ids.tolist() == [[7, -1], [9, 3], [4, -1]]
    rejected = forward(plain, metadata([[], [5], []]), None, logits.clone(), greedy)
    assert rejected.sampled_token_ids.tolist() == [[7, -1], [9, -1], [4, -1]]
