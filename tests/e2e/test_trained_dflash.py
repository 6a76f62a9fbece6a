"""The trained DFlash drafter with upstream `method: dflash` through real vLLM (CPU, V1 runner):
its drafts are accepted, unlike a random drafter's.

Baselines and how they were measured: docs/fidelity.md.
"""

import pytest

from fixtures import trained_llm as F


@pytest.fixture(scope="module")
def spec_llm():
    llm = F.build_llm(1024, drafter=F.trained_model("qwen36-dflash"), disable_log_stats=False,
                      additional_config=F.EVERY_DRAFT_VERIFIED)
    yield llm
    del llm


def test_trained_drafter_is_accepted(spec_llm):
    result = F.acceptance(spec_llm, F.code_prompts(spec_llm.get_tokenizer(), 8), 96)
    # A random drafter accepts nothing (1.0); the issue asks for more than 1 + 0.5.
    assert result["mean_acceptance_length"] > 1.5, result
    assert result["per_position_rate"][0] > 0.3, result
