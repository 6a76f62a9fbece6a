"""benchmarks/dflash_gpu.py's CPU smoke run (tiny shapes through vLLM): every engine kind starts, keeps the
predictable target's output (each child checks it), and the table and JSON have what the GPU run reports. The script
runs as users run it (``python -m benchmarks.dflash_gpu``): tests import nothing from ``benchmarks``
(tests/test_layout.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_tiny_run_reports_every_engine_and_ratio(tmp_path):
    out = tmp_path / "dflash_gpu.json"
    command = [sys.executable, "-m", "benchmarks.dflash_gpu", "--tiny", "--concurrency", "2", "--levels", "0.9",
               "--modes", "none", "fixed", "gated", "--repeats", "1", "--workdir", str(tmp_path / "work"),
               "--card-per-level", "--resume", "--json", str(out)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.is_file(), proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(out.read_text())
    assert proc.returncode == 0, {k: v.get("log_tail") for k, v in result["engines"].items()}
    assert set(result["engines"]) == {"none@0.9", "fixed@0.9", "gated@0.9"}  # none alone pairs the A/A control
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)  # a second run resumes
    assert again.returncode == 0, again.stdout[-3000:]
    assert json.loads(out.read_text())["engines"] == result["engines"]  # kept, not measured again
    assert result["git_commit"] and result["command"].startswith("python")
    (row,) = result["rows"]
    assert row["none_tok_s"] > 0 and row["fixed/none"] > 0 and row["gated/none"] > 0 and row["gated/best"] > 0
    fixed = result["engines"]["fixed@0.9"]["cells"][0]
    assert fixed["num_drafts"] > 0 and 0 < fixed["num_accepted_tokens"] <= fixed["num_draft_tokens"]
    assert all(e["cells"][0]["median_step_ms"] > 0 for e in result["engines"].values())
    assert result["engines"]["gated@0.9"]["gate"].startswith("gate: ")
    assert result["engines"]["none@0.9"]["vllm"] and result["engines"]["none@0.9"]["device"] == "cpu"
