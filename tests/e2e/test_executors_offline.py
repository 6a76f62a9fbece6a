"""Luce executors through real vLLM, in-process: which class serves each family, its layer plan,
greedy token parity with vLLM's own executor, and bad configuration stopping `LLM(...)`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXECUTOR_FAMILIES
from tests.e2e.generate_tokens import MAX_TOKENS, build_llm, greedy_run

pytestmark = pytest.mark.e2e
FAMILIES = sorted(EXECUTOR_FAMILIES)
HERE = Path(__file__).parent


def run_generate(model_dirs, out: Path, executors: str) -> dict:
    env = dict(os.environ, VLLM_LUCE_EXECUTORS=executors, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run([sys.executable, str(HERE / "generate_tokens.py"), str(out), *map(str, model_dirs)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def model_dirs(tiny_model):
    return {family: tiny_model(family) for family in FAMILIES}


@pytest.fixture(scope="module")
def upstream_tokens(model_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("upstream") / "tokens.json"
    return run_generate(model_dirs.values(), out, executors="off")


@pytest.fixture(scope="module")
def luce_runs(model_dirs):
    """One in-process engine per family, with the plugin's executors: tokens, class and layer plan."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import SamplingParams

    runs = {}
    for family, model_dir in model_dirs.items():
        llm = build_llm(model_dir)
        chat = llm.chat([{"role": "user", "content": "Say hello."}],
                        SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)
        runs[family] = {**greedy_run(llm), "chat": chat[0].outputs[0],
                        "plan": llm.apply_model(lambda model: model.luce_layers)[0]}
        del llm
    return runs


@pytest.mark.parametrize("family", FAMILIES)
def test_luce_executor_serves_the_family(family, luce_runs):
    expected_class, expected_summary = EXECUTOR_FAMILIES[family]
    run = luce_runs[family]
    assert run["class"] == expected_class
    assert run["plan"].summary() == expected_summary
    assert [layer.index for layer in run["plan"].full_attention] == [3]
    assert all(len(tokens) == MAX_TOKENS for tokens in run["tokens"])
    assert len(run["chat"].token_ids) > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_match_vllms_own_executor(family, luce_runs, upstream_tokens, model_dirs):
    upstream = upstream_tokens[str(model_dirs[family])]
    assert not upstream["class"].startswith("Luce"), "VLLM_LUCE_EXECUTORS=off must keep vLLM's class"
    assert luce_runs[family]["tokens"] == upstream["tokens"]


def test_bad_additional_config_stops_llm_with_the_key_named(model_dirs):
    from vllm import LLM

    with pytest.raises(Exception, match=r"luce\.kvflash\.pool_tokens: got 0; expected a positive integer"):
        LLM(model=str(model_dirs["laguna"]), enforce_eager=True, max_model_len=512,
            additional_config={"luce": {"kvflash": {"pool_tokens": 0}}})
