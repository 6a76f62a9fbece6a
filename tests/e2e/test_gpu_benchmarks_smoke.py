"""The end-to-end GPU benchmarks (``benchmarks/kvflash_gpu.py``, ``kvflash_many_short.py``, ``pflash_gpu.py``) in
their ``--tiny`` mode through real vLLM on CPU, so that a broken script never costs GPU time: every field of their
JSON, sane numbers, KVFlash's pool honoured and PFlash compressing. Timings on this machine mean nothing and are only
checked to be there. Each runs vLLM alone and the feature (the plugin with the feature off, ``off``, is the same path
as the feature's engine without its config)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
HEADER = ("device", "vllm", "torch", "date", "git_commit", "command", "host", "results", "summary", "settings")


def run(module: str, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / f"{module}.json"
    command = [sys.executable, "-m", f"benchmarks.{module}", "--tiny", "--workdir", str(tmp_path / module),
               "--models", str(tmp_path / "models"), "--json", str(out), *args]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    data = json.loads(out.read_text())
    assert all(key in data for key in HEADER), sorted(data)
    assert data["vllm"] and data["device"].startswith("CPU") and f"benchmarks.{module} --tiny" in data["command"]
    return data


def test_kvflash_gpu_tiny(tmp_path):
    data = run("kvflash_gpu", tmp_path, "--modes", "vllm", "kvflash")
    pool, contexts, steps = data["pool_tokens"], data["settings"]["contexts"], data["settings"]["decode_steps"]
    alone, kv = data["results"]["vllm"], data["results"]["kvflash"]
    assert alone["model_class"] == "Qwen3_5ForConditionalGeneration", alone["model_class"]
    assert kv["model_class"] == "LuceQwen3_5ForConditionalGeneration", kv["model_class"]
    for r in (alone, kv):
        assert [c["context"] for c in r["contexts"]] == contexts
        for row in (*r["contexts"], r["batch"]):
            assert row["step_ms"] > 0 and row["tok_s"] > 0 and row["window_tokens"] >= steps * row["requests"] // 2
            assert row["gpu_kv_bytes_per_request"] > 0 and all(t > 0 for t in row["ttft_s"])
        assert r["batch"]["requests"] == data["settings"]["batch"] == r["batch"]["metrics"]["vllm:num_requests_running"]
    assert [g["type"] for g in alone["kv_cache"]["groups"]] == ["FullAttentionSpec"]
    assert [(g["type"], g["pool_tokens"]) for g in kv["kv_cache"]["groups"]] == [("KVFlashSpec", pool)]
    # the pool holds: every live request resident within it, the rest paged out: with the cache this roomy, every
    # chunk to free KV blocks (no host memory), none dropped
    paged = kv["batch"]["kvflash"]
    assert paged["bound"] and paged["live_requests"] == data["settings"]["batch"], paged
    assert all(0 < t <= pool for t in paged["resident_tokens"]) and paged["page_outs"] > 0 and paged["dropped"] == 0
    assert paged["cold_outs"] == paged["page_outs"] and paged["host_bytes"] == 0 and paged["bytes_out"] == 0, paged
    assert kv["batch"]["metrics"]["vllm:luce_kvflash_page_outs"] == paged["page_outs"]
    assert not alone["batch"]["kvflash"]["bound"]
    longest = max(contexts)
    length = str(data["settings"]["batch_context"] + 256)
    assert kv["kv_cache"]["max_concurrency"][length] > alone["kv_cache"]["max_concurrency"][length] > 0
    summary = data["summary"]
    assert set(summary["kvflash_vs_vllm"]["decode_speedup"]) == {str(n) for n in contexts}
    assert summary["kvflash_vs_vllm"]["decode_speedup"][str(longest)] > 0
    assert summary["kvflash"]["host_bytes_batch"] == paged["host_bytes"]
    assert {"flat", "longest_vs_vllm", "batch_vs_vllm", "batch_last_ttft_vs_vllm", "chunks_dropped"} <= set(
        summary["goals"])
    assert summary["goals"]["chunks_dropped"]["met"] and summary["kvflash"]["cold_page_outs_batch"] > 0


def test_pflash_gpu_tiny(tmp_path):
    data = run("pflash_gpu", tmp_path)
    contexts, shorts = data["settings"]["contexts"], data["settings"]["shorts"]
    alone, pf = data["results"]["vllm"], data["results"]["pflash"]
    assert alone["model_class"] == pf["model_class"] == "Qwen3ForCausalLM"
    for r in (alone, pf):
        assert [c["context"] for c in r["contexts"]] == contexts and r["short_alone_ttft_s"] > 0
        assert all(c["ttft_s"] > 0 and len(c["ttft_runs_s"]) == data["settings"]["reps"] for c in r["contexts"])
        behind = r["shorts_behind_long"]
        assert len(behind["short_ttft_s"]) == shorts and all(t > 0 for t in behind["short_ttft_s"])
    assert all(c["prefilled_tokens"] == c["context"] and c["scoring_s"] == 0 for c in alone["contexts"])
    # PFlash compressed every long prompt and scored it; the short ones (below its minimum) were left whole
    assert all(0 < c["prefilled_tokens"] < 0.2 * c["context"] and c["scoring_s"] > 0 for c in pf["contexts"])
    assert pf["shorts_behind_long"]["long_prefilled"] < data["settings"]["long"]
    assert pf["shorts_behind_long"]["long_scoring_s"] > 0
    prompts = pf["metrics"]
    assert prompts["vllm:luce_pflash_prompts{outcome=compressed}"] == 2 + len(contexts) * data["settings"]["reps"]
    assert prompts["vllm:luce_pflash_prompts{outcome=skipped_short_prompt}"] == 2 + shorts
    summary = data["summary"]["pflash_vs_vllm"]
    assert set(summary["ttft_speedup"]) == {str(n) for n in contexts} and summary["ttft_speedup"][str(contexts[-1])] > 0
    assert data["summary"]["pflash"]["kept_fraction"][str(contexts[-1])] < 0.2


def test_kvflash_many_short_tiny(tmp_path):
    data = run("kvflash_many_short", tmp_path)
    settings, alone, kv = data["settings"], data["results"]["vllm"], data["results"]["kvflash"]
    for r in (alone, kv):
        assert r["failed"] == 0 and r["long_completed"], r.get("errors")
        assert r["short_tokens"] == settings["shorts"] * settings["short_tokens"] and r["short_tok_s"] > 0
        assert len(r["short_ttft_s"]) == settings["shorts"] and r["metrics"]["vllm:num_preemptions"] >= 0
    assert not alone["kvflash"]["bound"] and kv["kvflash"]["bound"] and kv["kvflash"]["page_outs"] > 0
    assert kv["kvflash"]["dropped"] == kv["kvflash"]["lost"] == kv["kvflash"]["host_over_reserved"] == 0
    summary = data["summary"]
    assert summary["short_tok_s_ratio"] > 0 and set(summary["lost"]) == {"vllm", "kvflash"}
