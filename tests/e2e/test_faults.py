"""Faults through a real `vllm serve` with DFlash, KVFlash and PFlash on (one server for the module).

The server is built to be under pressure everywhere at once:
  * its DFlash drafter produces NaN (``fc.weight`` poisoned): every draft must be rejected, never verified;
  * a KV budget of a few blocks (``--num-gpu-blocks-override``): concurrent requests preempt each other;
  * KVFlash host memory of 4 chunks (``kvflash.host_bytes``): long prompts exhaust it and drop chunks;
  * client disconnects mid-stream, including while a long prompt is paging.
Each request either completes or fails with a clear error, the server stays up, and nothing leaks: once
idle, no request runs, no KVFlash pager or host page is held (read from `/metrics`).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from fixtures import serve_load as L
from fixtures.server import Server
from fixtures.trained import trained_model

pytestmark = pytest.mark.e2e

CHUNK_BYTES = 65536  # one 64-token chunk of the trained target's 2 full-attention layers (bf16 K and V)
HOST_BYTES = 4 * CHUNK_BYTES
GROW_TOKENS = 400  # decoding crosses KV block boundaries: running requests need new blocks
# A request here holds 51 blocks of 384 tokens at admission (Gated DeltaNet state for 1 + 15 draft
# positions in 3 layer groups, plus 1 attention block each for the pooled layers and the drafter) and 53
# once past 384 tokens: two are admitted, and the second block they both need forces a preemption.
KV_BLOCKS = 104


def nan_drafter(dst):
    shutil.copytree(trained_model("qwen36-dflash"), dst, symlinks=False)
    path = next(dst.glob("*.safetensors"))
    weights = load_file(str(path))
    weights["fc.weight"] = torch.full_like(weights["fc.weight"], float("nan"))
    save_file(weights, str(path), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("faults")
    models = work / "models"
    models.mkdir()
    (models / "qwen36-target").symlink_to(trained_model("qwen36-target"), target_is_directory=True)
    nan_drafter(models / "qwen36-target-DFlash")
    config = {"luce": {"kvflash": {"pool_tokens": L.POOL_TOKENS, "host_bytes": HOST_BYTES},
                       "pflash": {"drafter": str(trained_model("scorer")), "keep_ratio": 0.3,
                                  "min_prompt_tokens": L.PFLASH_MIN_PROMPT}}}
    srv = Server(models / "qwen36-target", work / "serve.log", *L.base_args(), "--speculative-model", "dflash",
                 "--num-gpu-blocks-override", str(KV_BLOCKS), "--additional-config", json.dumps(config),
                 served_name="t")
    with srv:
        yield srv


@pytest.fixture(scope="module")
def prompts():
    items = L.workload(16)
    return {"short": [i.prompt for i in items if i.kind == "short"], "long": [i.prompt for i in items if i.kind == "long"]}


def metrics(server) -> str:
    return L.scrape(server.base_url)


def wait_idle(server, timeout: float = 30.0) -> str:
    """Metrics once nothing runs and KVFlash holds nothing (values from workers lag up to a second)."""
    deadline = time.time() + timeout
    while True:
        text = metrics(server)
        busy = (L.metric(text, "vllm:num_requests_running") + L.metric(text, "vllm:num_requests_waiting")
                + L.metric(text, "vllm:luce_kvflash_requests") + L.metric(text, "vllm:luce_kvflash_host_bytes"))
        if busy == 0 or time.time() > deadline:
            return text
        time.sleep(0.5)


def assert_nothing_held(server) -> str:
    text = wait_idle(server)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:luce_kvflash_requests",
                 "vllm:luce_kvflash_host_bytes", "vllm:luce_kvflash_host_chunks", "vllm:luce_kvflash_resident_chunks"):
        assert L.metric(text, name) == 0, f"{name} = {L.metric(text, name)} after the server went idle"
    return text


def complete(server, prompt: str, max_tokens: int = 16, **extra) -> dict:
    r = httpx.post(server.base_url + "/completions", timeout=300, json={
        "model": "t", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


async def stream_then_disconnect(server, prompt: str, chunks: int, **extra) -> int:
    """Stream a long completion, read ``chunks`` events, then drop the connection."""
    body = {"model": "t", "prompt": prompt, "max_tokens": 400, "temperature": 0, "stream": True, **extra}
    seen = 0
    async with httpx.AsyncClient(timeout=300) as client:
        async with client.stream("POST", server.base_url + "/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    seen += 1
                    if seen >= chunks:
                        break  # leaving the block closes the connection mid-stream
    return seen


def test_client_disconnects_mid_stream_release_everything(server, prompts):
    async def burst():
        return await asyncio.gather(*(stream_then_disconnect(server, p, 3) for p in prompts["short"][:6]))

    assert all(n == 3 for n in asyncio.run(burst()))
    assert_nothing_held(server)
    assert complete(server, prompts["short"][0])["choices"][0]["finish_reason"] == "length"


def test_abort_during_paging_returns_host_pages(server, prompts):
    """Long prompts (PFlash opted out, so KVFlash pages them) are dropped mid-decode, while paging."""
    before = L.metric(metrics(server), "vllm:luce_kvflash_page_outs_total")
    opt_out = {"vllm_xargs": {"luce_pflash": "off"}}

    async def burst():
        return await asyncio.gather(*(stream_then_disconnect(server, p, 5, **opt_out) for p in prompts["long"][:3]))

    asyncio.run(burst())
    text = assert_nothing_held(server)
    assert L.metric(text, "vllm:luce_kvflash_page_outs_total") > before  # they were paging when dropped


def test_preemption_under_kv_pressure_completes_every_request(server, prompts):
    """Requests that grow past what a few KV blocks hold: vLLM preempts and resumes them, KVFlash
    drops and rebuilds their pagers, and every request still completes in full."""
    before = L.metric(metrics(server), "vllm:num_preemptions_total")
    work = [L.Item(i, "short", p, greedy=i % 2 == 0, max_tokens=GROW_TOKENS)
            for i, p in enumerate(prompts["short"][:6])]
    results, _ = asyncio.run(L.run_load(server.base_url, "t", work, len(work)))
    assert [r.error for r in results if r.error] == []
    assert all(r.completion_tokens == GROW_TOKENS for r in results)
    text = assert_nothing_held(server)
    assert L.metric(text, "vllm:num_preemptions_total") > before, "the KV budget never forced a preemption"
    # A greedy prompt gives the same text however often it was preempted.
    by_prompt: dict[str, set[str]] = {}
    for r in results:
        if r.item.greedy:
            by_prompt.setdefault(r.item.prompt, set()).add(r.text)
    assert all(len(texts) == 1 for texts in by_prompt.values()), by_prompt


def test_nan_drafter_is_never_verified_and_requests_complete(server, prompts):
    out = complete(server, prompts["short"][1], max_tokens=24)
    assert out["usage"]["completion_tokens"] == 24
    text = wait_idle(server)
    assert L.metric(text, "vllm:luce_dflash_gate_steps_total", mode="spec") > 0  # it did try to speculate
    assert L.metric(text, "vllm:luce_dflash_verified_tokens_total") == 0
    assert L.metric(text, "vllm:spec_decode_num_accepted_tokens_total") == 0


def test_host_memory_for_paging_exhausted_drops_chunks_and_completes(server, prompts):
    out = complete(server, prompts["long"][0], max_tokens=24, vllm_xargs={"luce_pflash": "off"})
    assert out["usage"]["completion_tokens"] == 24
    text = assert_nothing_held(server)
    assert L.metric(text, "vllm:luce_kvflash_host_budget_drops_total") > 0
    assert "luce.kvflash.host_bytes = %d" % HOST_BYTES in server.log_text()


def test_server_survived_every_fault(server, prompts):
    assert httpx.get(server.base_url.removesuffix("/v1") + "/health", timeout=10).status_code == 200
    assert complete(server, prompts["short"][2])["usage"]["completion_tokens"] == 16
    log = server.log_text()
    assert "Traceback" not in log and "EngineDeadError" not in log
