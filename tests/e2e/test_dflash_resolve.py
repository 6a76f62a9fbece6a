"""`--speculative-model dflash` through real vLLM (CPU, V1 runner): the drafter is found next to
the target, speculation leaves greedy output unchanged, and resolution or matching failures stop
startup with a clear message. The trained fixture pair is laid out as users keep theirs:
``models/target`` and its sibling ``models/target-DFlash-b16``."""

import os
import subprocess

import pytest

from fixtures import trained_llm as F
from tests.e2e.dflash_probe import assert_same_until_near_tie, greedy_with_margins
from fixtures.server import SERVE_ENV, Server, vllm_command
from fixtures.trained import trained_model

pytestmark = pytest.mark.e2e
PROMPTS = ["def main():\n", "import os\nimport sys\n\n", "class Config:\n    def __init__(self", "for i in range("]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    (root / "target").symlink_to(trained_model("qwen36-target"), target_is_directory=True)
    (root / "target-DFlash-b16").symlink_to(trained_model("qwen36-dflash"), target_is_directory=True)
    return root


@pytest.fixture(scope="module")
def plain_run():
    llm = F.build_llm(1024)
    run = greedy_with_margins(llm, PROMPTS, 40)
    del llm
    return run


def test_dflash_word_resolves_the_sibling_and_output_is_unchanged(models_dir, plain_run):
    from vllm import LLM

    llm = LLM(model=str(models_dir / "target"), speculative_config={"model": "dflash"}, dtype="bfloat16",
              enforce_eager=True, max_model_len=1024, enable_prefix_caching=False, seed=0)
    try:
        spec = llm.llm_engine.vllm_config.speculative_config
        assert (spec.method, spec.num_speculative_tokens) == ("dflash", 15)  # block size 16 - 1
        assert spec.model == str(models_dir / "target-DFlash-b16")
        tokens, margins = plain_run
        assert_same_until_near_tie(tokens, margins, greedy_with_margins(llm, PROMPTS, 40)[0])
    finally:
        del llm  # a failed assertion must not keep this engine alive into the next test


def test_mismatched_drafter_stops_startup_naming_both_values(tiny_model):
    from vllm import LLM

    from vllm_luce.spec_decode.resolve import DrafterMismatch

    with pytest.raises(DrafterMismatch, match="vocab_size: drafter 4096 vs target 1024"):
        LLM(model=str(tiny_model("qwen3_6")), speculative_config={"model": str(trained_model("qwen36-dflash"))},
            enforce_eager=True, max_model_len=256, enable_prefix_caching=False)


def test_vllm_serve_speculative_model_dflash(models_dir, plain_run, tmp_path):
    from openai import OpenAI

    tokens, margins = plain_run
    with Server(models_dir / "target", tmp_path / "serve.log", "--speculative-model", "dflash",
                "--no-enable-prefix-caching", "--dtype", "bfloat16") as server:
        client = OpenAI(base_url=server.base_url, api_key="unused")
        reply = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=40, temperature=0,
                                          extra_body={"return_token_ids": True, "ignore_eos": True})
        assert_same_until_near_tie(tokens[:1], margins[:1], [list(reply.choices[0].token_ids)])
        log = server.log_text()
    assert f"DFlash drafter {models_dir / 'target-DFlash-b16'} (sibling of the target)" in log, log[-3000:]


def test_vllm_serve_without_a_drafter_lists_the_places_tried(models_dir, tmp_path):
    lonely = tmp_path / "lonely"
    lonely.symlink_to(models_dir / "target", target_is_directory=True)
    env = dict(os.environ, **SERVE_ENV, HF_HUB_CACHE=str(tmp_path / "hub"))
    env.pop("VLLM_LUCE_DRAFTER", None)
    proc = subprocess.run([*vllm_command(), str(lonely), "--port", "1", "--speculative-model", "dflash"],
                          env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "no DFlash drafter found" in output and "Tried, in order" in output, output[-3000:]
    assert f"{lonely}/dflash/" in output and "$VLLM_LUCE_DRAFTER (unset)" in output
