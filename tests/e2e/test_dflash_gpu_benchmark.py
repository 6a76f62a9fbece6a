"""benchmarks/dflash_gpu.py's CPU smoke run (tiny shapes through vLLM): every engine kind starts, keeps the
predictable target's output (each child checks it), and the table and JSON have what the GPU run reports."""

import json

import pytest

from benchmarks import dflash_gpu

pytestmark = pytest.mark.e2e


def test_tiny_run_reports_every_engine_and_ratio(tmp_path):
    out = tmp_path / "dflash_gpu.json"
    status = dflash_gpu.main(["--tiny", "--concurrency", "2", "--levels", "0.9", "--modes", "none", "fixed", "gated",
                              "--repeats", "1", "--workdir", str(tmp_path / "work"), "--json", str(out)])
    result = json.loads(out.read_text())
    assert status == 0, {k: v.get("log_tail") for k, v in result["engines"].items()}
    assert set(result["engines"]) == {"none", "fixed@0.9", "gated@0.9"}
    assert result["git_commit"] and result["command"].startswith("python")
    (row,) = result["rows"]
    assert row["none_tok_s"] > 0 and row["fixed/none"] > 0 and row["gated/none"] > 0 and row["gated/best"] > 0
    fixed = result["engines"]["fixed@0.9"]["cells"][0]
    assert fixed["num_drafts"] > 0 and 0 < fixed["num_accepted_tokens"] <= fixed["num_draft_tokens"]
    assert result["engines"]["gated@0.9"]["gate"].startswith("gate: ")
    assert result["engines"]["none"]["vllm"] and result["engines"]["none"]["device"] == "cpu"
