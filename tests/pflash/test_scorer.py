"""The PFlash scorer's drafter forward against Hugging Face transformers (eager attention, fp32):
post-RoPE tail attention must equal HF's own attention probabilities of the last rows."""

from __future__ import annotations

import pytest
import torch

from fixtures.trained import heldout_files, trained_model
from vllm_luce.pflash.drafter_spec import DrafterSpec
from vllm_luce.pflash.scorer import DrafterScorer, ScoringConfig, choose_dtype

L = 8


@pytest.fixture(scope="module")
def spec():
    return DrafterSpec.load(trained_model("scorer"))


@pytest.fixture(scope="module")
def prompt_and_hf(spec):
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(spec.path))
    ids = tok.encode(heldout_files()[0]["text"], add_special_tokens=False)[:301]
    model = Qwen3ForCausalLM.from_pretrained(str(spec.path), dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True)
    per_layer = torch.stack([a[0, :, -L:, :] for a in out.attentions])  # [layers, H, L, S]
    return ids, per_layer


def _scorer(spec, **kw):
    return DrafterScorer(spec, "cpu", torch.float32, ScoringConfig(pool_kernel=1, **kw))


def test_post_rope_scores_equal_hf_attention(spec, prompt_and_hf):
    ids, per_layer = prompt_and_hf
    expected = per_layer.amax(dim=(0, 1)).mean(0)
    got = _scorer(spec, pre_rope=False).token_scores(ids)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_early_exit_scores_only_the_first_layers(spec, prompt_and_hf):
    ids, per_layer = prompt_and_hf
    expected = per_layer[:2].amax(dim=(0, 1)).mean(0)
    scorer = _scorer(spec, pre_rope=False, early_exit_layers=2)
    assert scorer.num_layers == 2 and "model.layers.2.mlp.up_proj.weight" not in scorer.w
    torch.testing.assert_close(scorer.token_scores(ids), expected, rtol=1e-4, atol=1e-6)


def test_pre_rope_scores_are_a_distribution_per_row(spec, prompt_and_hf):
    ids, _ = prompt_and_hf
    scores = _scorer(spec).token_scores(ids)
    assert scores.shape == (len(ids),) and torch.isfinite(scores).all() and (scores >= 0).all()
    smoothed = DrafterScorer(spec, "cpu", torch.float32, ScoringConfig()).token_scores(ids)
    assert smoothed.shape == scores.shape
    assert smoothed.std() < scores.std()  # the 13-token average pool smooths


def test_out_of_vocabulary_token_is_refused(spec):
    with pytest.raises(ValueError, match="vocabulary"):
        _scorer(spec).token_scores([1, 2, spec.vocab_size])


def test_dtype_choice():
    assert choose_dtype(torch.device("cpu")) == torch.float32
    assert choose_dtype(torch.device("cpu"), "bfloat16") == torch.bfloat16


def test_warm_up_scores_several_sparse_blocks_on_a_gpu_only(spec, monkeypatch):
    """The warm-up pays Triton's compile where the kernels run (CUDA) and costs nothing elsewhere."""
    scorer = _scorer(spec)
    lengths = []
    monkeypatch.setattr(scorer, "token_scores", lambda ids: lengths.append((len(ids), max(ids))))
    scorer.warm_up()
    assert lengths == []
    scorer.device = torch.device("cuda")  # only the warm-up's decision reads it
    scorer.warm_up()
    assert [n for n, _ in lengths] == list(scorer.WARM_UP_LENGTHS) and all(top < spec.vocab_size for _, top in lengths)
    assert {n % 16 == 0 for n in scorer.WARM_UP_LENGTHS} == {True, False}
