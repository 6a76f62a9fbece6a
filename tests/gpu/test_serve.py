"""`vllm serve` on the GPU with vLLM's defaults and the openai client: `--speculative-model dflash` on the
trained hybrid pair, then DFlash, KVFlash and PFlash together (a tools request is never compressed)."""

import json
import urllib.request
from pathlib import Path

import pytest

from fixtures.server import Server
from fixtures import needle as N
from fixtures.trained import heldout_files, trained_model
from tests.gpu.conftest import GPU_SHARE, KV_CACHE_BYTES, TP, VLLM_ADDITIONAL, gpu_env, keep_log

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a key up.",
                                           "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}}]


class GpuServer(Server):
    def __init__(self, model: Path, log_path: Path, *extra: str):
        super().__init__(model, log_path, "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
                         "--gpu-memory-utilization", str(GPU_SHARE), "--tensor-parallel-size",
                         str(TP), *extra)
        self.args = [a for a in self.args if a != "--enforce-eager"]  # CUDA graphs on, as vLLM defaults
        self.args[self.args.index("--max-model-len") + 1] = "4096"
        self.env = gpu_env()

    def start(self, timeout: float = 600) -> "GpuServer":
        """A hybrid target with DFlash and PFlash took over 240 s to become healthy beside other engines on
        the card (vLLM's own Gated DeltaNet Triton warmup is about 90 s of it)."""
        return super().start(timeout)

    def stop(self):
        super().stop()
        keep_log(self.log_path)

    def metrics(self) -> str:
        return urllib.request.urlopen(self.base_url[:-3] + "/metrics").read().decode()

    def drafts(self) -> float:
        """vLLM's count of verified drafts (spec_decode_num_drafts), from /metrics."""
        lines = [line for line in self.metrics().splitlines() if line.startswith("vllm:spec_decode_num_drafts")]
        assert lines, "no vllm:spec_decode_num_drafts in /metrics"
        return float(lines[0].split()[-1])


@pytest.fixture(scope="module")
def cases():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(trained_model("tokenizer")))
    return N.make_cases(tok, list(heldout_files()), tokens=2048, depths=(0.2, 0.8), seeds=range(1))


def test_all_features_under_vllm_serve(trained_hybrid, tmp_path, cases):
    from openai import OpenAI

    config = {**VLLM_ADDITIONAL, "luce": {"kvflash": {"pool_tokens": 1024},
                       "pflash": {"drafter": str(trained_model("scorer")), "keep_ratio": 0.2, "min_prompt_tokens": 512}}}
    with GpuServer(trained_hybrid, tmp_path / "serve.log", "--speculative-model", "dflash",
                   "--additional-config", json.dumps(config)) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused")
        for case in cases:
            full = client.completions.create(model="tiny", prompt=case.prompt, max_tokens=8, temperature=0,
                                             extra_body={"vllm_xargs": {"luce_pflash": "off"}})
            short = client.completions.create(model="tiny", prompt=case.prompt, max_tokens=8, temperature=0)
            assert full.usage.prompt_tokens == case.prompt_tokens
            assert short.usage.prompt_tokens < 0.6 * full.usage.prompt_tokens
            assert short.choices[0].text.startswith(case.answer), short.choices[0].text
        tools = client.chat.completions.create(model="tiny", max_tokens=4, temperature=0, tools=TOOLS, tool_choice="none",
                                               messages=[{"role": "user", "content": cases[0].prompt}])
        plain = client.chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                               messages=[{"role": "user", "content": cases[0].prompt}])
        assert tools.usage.prompt_tokens > 1.5 * plain.usage.prompt_tokens  # tools: never compressed
        assert server.drafts() > 0
        assert "vllm:luce_kvflash_requests" in server.metrics()


def test_dflash_on_a_dense_target_under_vllm_serve(tiny_model, tiny_drafter, tmp_path):
    """`--speculative-model dflash` on a Qwen3 dense target (z-lab's flagship targets are dense; vLLM runs them
    on Model Runner V2): the sibling drafter is found, drafts are verified, and greedy completions equal a
    server without speculation."""
    from openai import OpenAI

    models = tmp_path / "models"
    models.mkdir()
    (models / "qwen3").symlink_to(tiny_model("qwen3"), target_is_directory=True)
    (models / "qwen3-DFlash").symlink_to(tiny_drafter("qwen3"), target_is_directory=True)
    prompts = ["def fibonacci(n):\n    ", "import json\n\nclass Encoder", "The quick brown fox"]
    completions = {}
    for name, extra in (("plain", ()), ("dflash", ("--speculative-model", "dflash"))):
        with GpuServer(models / "qwen3", tmp_path / f"{name}.log", "--additional-config",
                       json.dumps(VLLM_ADDITIONAL), *extra) as server:
            client = OpenAI(base_url=server.base_url, api_key="unused")
            completions[name] = [client.completions.create(model="tiny", prompt=p, max_tokens=32, temperature=0,
                                                           extra_body={"ignore_eos": True}).choices[0].text
                                 for p in prompts]
            if name == "dflash":
                assert server.drafts() > 0
    assert completions["dflash"] == completions["plain"]
