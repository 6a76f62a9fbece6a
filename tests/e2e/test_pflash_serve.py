"""PFlash through `vllm serve` and the official `openai` client (trained target, trained scorer)."""

from __future__ import annotations

import json
import subprocess

import pytest

from fixtures.server import SERVE_ENV, Server, vllm_command
from fixtures import needle as N
from fixtures.trained import heldout_files, trained_model

pytestmark = pytest.mark.e2e

KEEP = 0.2
OFF = {"vllm_xargs": {"luce_pflash": "off"}}
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a key up.",
                                           "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}}]


def _pflash_config(drafter) -> str:
    return json.dumps({"luce": {"pflash": {"drafter": str(drafter), "keep_ratio": KEEP, "min_prompt_tokens": 512}}})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("pflash-serve") / "serve.log"
    with Server(trained_model("qwen36-target"), log, "--max-model-len", "4096", "--no-enable-prefix-caching",
                "--additional-config", _pflash_config(trained_model("scorer"))) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url, api_key="unused")


@pytest.fixture(scope="module")
def cases():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(trained_model("tokenizer")))
    return N.make_cases(tok, list(heldout_files()), tokens=2048, depths=(0.2, 0.8), seeds=range(1))


def _chat(client, text, **kw):
    return client.chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": text}], **kw)


def test_completion_prompt_is_compressed_and_answers(client, cases):
    for case in cases:
        full = client.completions.create(model="tiny", prompt=case.prompt, max_tokens=8, temperature=0, extra_body=OFF)
        short = client.completions.create(model="tiny", prompt=case.prompt, max_tokens=8, temperature=0)
        assert full.usage.prompt_tokens == case.prompt_tokens
        assert short.usage.prompt_tokens <= 2 * KEEP * full.usage.prompt_tokens + 64
        assert short.choices[0].text.startswith(case.answer), short.choices[0].text


def test_chat_usage_reports_the_prefilled_tokens(client, cases):
    full = _chat(client, cases[0].prompt, extra_body=OFF).usage.prompt_tokens
    short = _chat(client, cases[0].prompt).usage.prompt_tokens
    assert short < 0.5 * full


def test_tools_and_response_format_requests_are_untouched(client, cases):
    full = _chat(client, cases[0].prompt, extra_body=OFF).usage.prompt_tokens
    with_tools = _chat(client, cases[0].prompt, tools=TOOLS, tool_choice="none")
    assert with_tools.usage.prompt_tokens == full  # this chat template does not render tools
    as_json = _chat(client, cases[0].prompt, response_format={"type": "json_object"})
    assert as_json.usage.prompt_tokens == full


def test_streaming_and_short_prompts_work(client):
    chunks = list(client.completions.create(model="tiny", prompt="import os\n", max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    full = client.completions.create(model="tiny", prompt="import os\n", max_tokens=1, extra_body=OFF)
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens  # below min_prompt_tokens: as sent


def test_server_logs_each_compression(server):
    log = server.log_text()
    assert "PFlash drafter scorer on cpu" in log and "PFlash: request" in log and "-> " in log


@pytest.mark.parametrize("make_bad,message", [
    (lambda d: (d / "model.safetensors").write_bytes(b"\x08\x00"), "is not a complete safetensors file"),
    (lambda d: (d / "config.json").write_text('{"architectures": ["BertModel"]}'), "supported drafters"),
])
def test_bad_drafter_stops_vllm_serve(tmp_path, make_bad, message):
    import shutil

    drafter = tmp_path / "drafter"
    shutil.copytree(trained_model("scorer"), drafter)
    make_bad(drafter)
    args = [*vllm_command(), str(trained_model("qwen36-target")), "--host", "127.0.0.1", "--port", "1",
            "--max-model-len", "4096", "--additional-config", _pflash_config(drafter)]
    import os

    done = subprocess.run(args, capture_output=True, text=True, timeout=240, env=dict(os.environ, **SERVE_ENV))
    assert done.returncode != 0
    assert "luce.pflash.drafter" in done.stderr + done.stdout and message in done.stderr + done.stdout
