"""`vllm serve` with the plugin, queried by the official `openai` client: one server per family."""

import re
import subprocess
import os

import pytest

from tests.conftest import EXECUTOR_FAMILIES
from fixtures.server import SERVE_ENV, Server, vllm_command

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=sorted(EXECUTOR_FAMILIES))
def server(request, tiny_model, tmp_path_factory):
    family = request.param
    log_path = tmp_path_factory.mktemp(f"serve-{family}") / "serve.log"
    with Server(tiny_model(family), log_path) as running:
        running.family = family
        yield running


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url, api_key="unused")


def test_completion(server, client):
    reply = client.completions.create(model="tiny", prompt="def hello():", max_tokens=12, temperature=0)
    assert reply.choices[0].text and reply.usage.completion_tokens > 0


def test_chat_completion(server, client):
    reply = client.chat.completions.create(model="tiny", max_tokens=12, temperature=0,
                                           messages=[{"role": "user", "content": "Say hello."}])
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage.completion_tokens > 0 and reply.usage.prompt_tokens > 0


def test_streaming_completion(server, client):
    chunks = list(client.completions.create(model="tiny", prompt="import os", max_tokens=8,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices)


def test_plugin_loads_in_all_three_processes(server):
    log = server.log_text()
    roles = set(re.findall(r"vllm-luce [\d.]+ \[(api-server|engine-core|worker-\d+) pid=\d+\]", log))
    assert {"api-server", "engine-core", "worker-0"} <= roles, log[-3000:]
    expected_class, summary = EXECUTOR_FAMILIES[server.family]
    assert f"is served by {expected_class} ({summary}); features: none" in log
    assert "executors: auto (7 architectures" in log


def test_bad_additional_config_stops_vllm_serve_with_the_key_named(tiny_model):
    args = [*vllm_command(), str(tiny_model("laguna")), "--host", "127.0.0.1", "--port", "1",
            "--additional-config", '{"luce": {"kvflash": {"chunk_tokens": 100}}}']
    proc = subprocess.run(args, env=dict(os.environ, **SERVE_ENV), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "luce.kvflash.chunk_tokens: got 100; expected a power of two in [16, 1024]" in output, output[-3000:]
