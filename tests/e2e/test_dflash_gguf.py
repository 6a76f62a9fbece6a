"""GGUF drafters through real vLLM (CPU, V1 runner): `vllm-luce convert-drafter` output, found by
`--speculative-model dflash` next to the target, drafts exactly what the safetensors drafter drafts."""

import pytest

from fixtures import trained_llm as F
from tests.e2e.dflash_probe import drafts_by_prompt, engine
from fixtures.trained import trained_model
from vllm_luce.cli import main as cli

pytestmark = pytest.mark.e2e
NO_GATE = {"luce": {"dflash": {"gate": False}}}


def drafts(model, drafter, prompts_from=None):
    from vllm import LLM

    llm = LLM(model=str(model), speculative_config={"model": str(drafter)}, enforce_eager=True, max_model_len=1024,
              dtype="bfloat16", seed=0, enable_prefix_caching=False, additional_config=NO_GATE)
    prompts = F.code_prompts(llm.get_tokenizer(), 4)
    seen, outs = drafts_by_prompt(llm, prompts, 24)
    resolved = engine(llm).vllm_config.speculative_config.model
    del llm
    return seen, outs, resolved


def test_gguf_drafter_drafts_what_the_safetensors_drafter_drafts(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "target").symlink_to(trained_model("qwen36-target"), target_is_directory=True)
    assert cli(["convert-drafter", str(trained_model("qwen36-dflash")), str(models / "target-DFlash.gguf")]) == 0
    expected, expected_out, _ = drafts(models / "target", trained_model("qwen36-dflash"))
    got, got_out, resolved = drafts(models / "target", "dflash")
    assert "target-DFlash-" in resolved and resolved.endswith(tuple("0123456789abcdef"))  # the cached conversion
    assert got_out == expected_out
    assert sum(len(v) for v in expected.values()) >= 8 and got == expected
