"""Adaptive verify width and the non-finite guard through real vLLM (CPU, V1 runner), on the
trained Qwen3.6 pair: fewer drafts are verified, output is unchanged, and a drafter whose logits
are NaN never crashes a step or changes output."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from fixtures import trained_llm as F
from tests.e2e.dflash_probe import assert_same_until_near_tie, greedy_with_margins
from fixtures.trained import trained_model

pytestmark = pytest.mark.e2e


def run(drafter=None, luce=None, prompts=4, tokens=48):
    extra = {"additional_config": {"luce": luce}} if luce else {}
    llm = F.build_llm(1024, drafter=drafter, disable_log_stats=False, **extra)
    try:
        out = greedy_with_margins(llm, F.code_prompts(llm.get_tokenizer(), prompts), tokens)
        counters = {m.name: m for m in llm.get_metrics()}
        verified = int(counters["vllm:spec_decode_num_draft_tokens"].value) if drafter else 0
    finally:
        del llm
    return out, verified


@pytest.fixture(scope="module")
def full_width():
    """Every draft verified (gate off): the reference run, compared up to near-ties
    (``tests/e2e/dflash_probe.py``)."""
    return run(trained_model("qwen36-dflash"), {"dflash": {"gate": False}})


def test_verify_width_cuts_unconfident_drafts_and_keeps_output(full_width):
    (full_out, margins), full_verified = full_width
    (cut_out, _), cut_verified = run(trained_model("qwen36-dflash"),
                                     {"dflash": {"gate": False, "verify_confidence": 0.5, "min_verify_tokens": 1}})
    assert_same_until_near_tie(full_out, margins, cut_out)
    assert 0 < cut_verified < full_verified / 2, (cut_verified, full_verified)


def test_nan_drafter_never_crashes_or_changes_output(full_width, tmp_path):
    (full_out, margins), _ = full_width
    nan_drafter = tmp_path / "nan-dflash"
    shutil.copytree(trained_model("qwen36-dflash"), nan_drafter)
    weights = load_file(str(nan_drafter / "model.safetensors"))
    weights["fc.weight"] = torch.full_like(weights["fc.weight"], float("nan"))
    save_file(weights, str(nan_drafter / "model.safetensors"), metadata={"format": "pt"})
    assert json.loads((nan_drafter / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
    (out, _), verified = run(nan_drafter, {"dflash": {"gate": False}})
    assert_same_until_near_tie(full_out, margins, out)
    assert verified == 0  # every draft came from non-finite logits: none was verified
