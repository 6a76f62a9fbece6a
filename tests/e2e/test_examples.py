"""Every example in examples/, run as a user (and CI) runs it: one subprocess each, default arguments
(the embedded trained models), asserting on what it prints. `tests/test_docs.py` checks that every
file in examples/ is named here.

- examples/offline_llm.py: LLM API with DFlash, KVFlash and PFlash on one engine.
- examples/convert_drafter.py: `vllm-luce convert-drafter`, then the GGUF drafter against the original.
- examples/demo.py --all-features: `vllm serve` with all three features, queried by
  examples/serve_openai_client.py (demo.py runs it against its server: one server start for both).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
# Examples that another example runs: the client needs a server, and demo.py starts one.
RUN_BY_ANOTHER = {"serve_openai_client.py": "demo.py"}


def run_example(name: str, *args: str, timeout: float = 300) -> str:
    """Run examples/<name> with this Python from the repository root; its stdout (stderr on failure)."""
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in the output:\n{text[-3000:]}"
    return float(match.group(1))


def test_offline_llm_runs_all_three_features():
    out = run_example("offline_llm.py")
    assert "needle answered: True" in out
    needle_sent = number(r"PFlash: needle prompt (\d+) ->", out)
    assert needle_sent > 1500 and number(r"PFlash: needle prompt \d+ -> (\d+) tokens", out) < 0.6 * needle_sent
    code = re.search(r"PFlash: code prompt (\d+) -> (\d+) tokens", out)  # opted out: prefilled in full
    assert code and int(code.group(1)) == int(code.group(2)) > 1500
    assert "'compressed': 1" in out and "'skipped_opted_out': 1" in out
    assert number(r"DFlash: gate ran (\d+) speculative", out) > 0
    assert number(r"; (\d+) drafts verified", out) > 0
    assert number(r"KVFlash: pool 1024 tokens per request; (\d+) chunks paged out", out) > 0  # the 2K code prompt
    assert "snippet:\nimport os" in out and "return f." in out  # the model completed the snippet


def test_convert_drafter_gguf_drafts_what_safetensors_drafts(tmp_path):
    gguf = tmp_path / "drafter.gguf"
    out = run_example("convert_drafter.py", "--out", str(gguf))
    assert gguf.stat().st_size > 1_000_000
    assert re.search(r"wrote .*drafter\.gguf: .*2 layers, hidden 256, .*block 16, target layers \[1, 4, 6\]", out)
    st = re.search(r"per position, safetensors drafter: (\[.*\])", out).group(1)
    gg = re.search(r"per position, GGUF drafter: +(\[.*\])", out).group(1)
    assert st == gg and sum(json.loads(st)) > 0, (st, gg)
    assert "GGUF drafter matches the safetensors drafter: True" in out


def test_demo_serves_all_features_and_the_openai_client_example_queries_it(tmp_path):
    out = run_example("demo.py", "--all-features", "--workdir", str(tmp_path), timeout=400)
    assert re.search(r"server: vllm serve --speculative-model dflash .*--additional-config .*healthy", out)
    # examples/serve_openai_client.py's output: the completion, PFlash's compression, the chat, the counters.
    assert number(r"completion \((\d+) tokens\):", out) > 0
    prefilled, full = re.search(r"prompt tokens prefilled: (\d+) \(the same prompt opted out of PFlash: (\d+)\)",
                                out).groups()
    assert int(full) > 1500 and int(prefilled) < 0.6 * int(full)
    assert "chat: " in out
    assert 'vllm:luce_pflash_prompts_total{outcome="compressed"} 1.0' in out
    assert number(r"vllm:luce_kvflash_page_outs_total\{rank=\"0\"\} ([\d.]+)", out) > 0
    assert number(r'vllm:luce_dflash_gate_steps_total\{mode="spec"\} ([\d.]+)', out) > 0
    # demo.py's own lines: vLLM's speculative-decoding counters and vllm-luce's log lines per process.
    assert re.search(r"speculative decoding: [1-9]\d* drafts verified", out)
    assert re.search(r"\[api-server pid=\d+\]: DFlash drafter .*qwen36-target-DFlash \(sibling of the target\)", out)
    assert re.search(r"\[engine-core pid=\d+\]: DFlash gate on", out)
    assert re.search(r"\[worker-0 pid=\d+\]: KVFlash on 2 layers", out)
    assert re.search(r"\[api-server pid=\d+\]: PFlash: request \S+: \d+ -> \d+ prompt tokens", out)
    assert "(server stopped)" in out
