"""PFlash through `vllm serve` and the official `openai` client (trained target, trained scorer): compression,
untouched requests, the scoring queue's bound and cancellation, and labels only from fixed sets."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest

from fixtures.engine_report import text_metric
from fixtures.server import SERVE_ENV, Server, vllm_command
from fixtures.serve_load import scrape
from fixtures import needle as N
from fixtures.trained import heldout_files, trained_model
from vllm_luce.metrics.store import PUBLISH_EVERY_S

pytestmark = pytest.mark.e2e

KEEP = 0.2
QUEUE = 3  # the server's max_queued_prompts: a burst of long prompts overflows it
OFF = {"vllm_xargs": {"luce_pflash": "off"}}
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a key up.",
                                           "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}}]


def _pflash_config(drafter, **settings) -> str:
    return json.dumps({"luce": {"pflash": {"drafter": str(drafter), "keep_ratio": KEEP, "min_prompt_tokens": 512,
                                           **settings}}})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("pflash-serve") / "serve.log"
    with Server(trained_model("qwen36-target"), log, "--max-model-len", "4096", "--no-enable-prefix-caching",
                "--additional-config", _pflash_config(trained_model("scorer"), max_queued_prompts=QUEUE)) as running:
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


def _usage_chunk(stream) -> object:
    """The usage of a stream with stream_options include_usage: its last chunk's, which has no choices."""
    chunks = list(stream)
    assert not chunks[-1].choices and all(c.usage is None for c in chunks[:-1])
    return chunks[-1].usage


def test_every_response_says_what_pflash_did_to_its_prompt(client, cases):
    """usage.luce_pflash on completions and chat, streamed (the usage chunk) and not: the prompt as sent, the tokens
    kept (usage.prompt_tokens), the outcome, and a compressed prompt's digest of the tokens kept."""
    case = cases[0]
    stream = {"stream": True, "stream_options": {"include_usage": True}}
    completion = {"model": "tiny", "prompt": case.prompt, "max_tokens": 2, "temperature": 0}
    digests = set()
    for usage in (client.completions.create(**completion).usage,
                  _usage_chunk(client.completions.create(**completion, **stream))):
        assert usage.prompt_tokens < 0.5 * case.prompt_tokens
        assert usage.luce_pflash == {"prompt_tokens_sent": case.prompt_tokens,
                                     "prompt_tokens_kept": usage.prompt_tokens, "outcome": "compressed",
                                     "kept_digest": usage.luce_pflash["kept_digest"]}
        digests.add(usage.luce_pflash["kept_digest"])
    whole = _chat(client, case.prompt, extra_body=OFF).usage  # the chat template's tokens, as sent and prefilled
    assert whole.luce_pflash == {"prompt_tokens_sent": whole.prompt_tokens, "prompt_tokens_kept": whole.prompt_tokens,
                                 "outcome": "skipped_opted_out"}
    for usage in (_chat(client, case.prompt).usage, _usage_chunk(_chat(client, case.prompt, **stream))):
        assert usage.prompt_tokens < 0.5 * whole.prompt_tokens
        assert usage.luce_pflash == {"prompt_tokens_sent": whole.prompt_tokens,
                                     "prompt_tokens_kept": usage.prompt_tokens, "outcome": "compressed",
                                     "kept_digest": usage.luce_pflash["kept_digest"]}
        digests.add(usage.luce_pflash["kept_digest"])
    assert len(digests) == 2  # the prompt kept alike, streamed or not; the chat template's prompt another
    assert _chat(client, case.prompt, tools=TOOLS, tool_choice="none").usage.luce_pflash["outcome"] == "skipped_tools"


def test_short_prompts_and_each_prompt_of_a_batch_carry_their_outcome(client, cases):
    short = client.completions.create(model="tiny", prompt="import os\n", max_tokens=1, temperature=0)
    assert short.usage.luce_pflash == {"prompt_tokens_sent": short.usage.prompt_tokens,
                                       "prompt_tokens_kept": short.usage.prompt_tokens,
                                       "outcome": "skipped_short_prompt"}
    for batch in (client.completions.create(model="tiny", prompt=[cases[0].prompt, "import os\n"], max_tokens=1,
                                            temperature=0).usage,
                  _usage_chunk(client.completions.create(model="tiny", prompt=[cases[0].prompt, "import os\n"],
                                                         max_tokens=1, temperature=0, stream=True,
                                                         stream_options={"include_usage": True}))):
        field = batch.luce_pflash
        assert [p["outcome"] for p in field["prompts"]] == ["compressed", "skipped_short_prompt"]
        assert field["prompts"][0]["prompt_tokens_sent"] == cases[0].prompt_tokens
        assert field["prompts"][1] == short.usage.luce_pflash
        assert field["prompt_tokens_kept"] == batch.prompt_tokens == sum(p["prompt_tokens_kept"] for p in field["prompts"])
        assert field["prompt_tokens_sent"] == cases[0].prompt_tokens + short.usage.prompt_tokens


def _prompts(server, outcome: str) -> float:
    return text_metric(scrape(server.base_url), "vllm:luce_pflash_prompts_total", outcome=outcome)


def _before(server) -> str:
    """/metrics once the worker's values from the tests before have landed: it publishes them up to
    PUBLISH_EVERY_S late, and a `before` one prompt short makes a delta one too many."""
    time.sleep(1.5 * PUBLISH_EVERY_S)
    return scrape(server.base_url)


def _queue_settled(server, queued: float, timeout: float = 20.0) -> str:
    """/metrics once rank 0's queue holds nothing and has taken ``queued`` prompts (its values lag up to 1 s)."""
    deadline = time.time() + timeout
    while True:
        text = scrape(server.base_url)
        held = text_metric(text, "vllm:luce_pflash_queue_depth")
        taken = text_metric(text, "vllm:luce_pflash_queued_prompts_total")
        if (held == 0 and taken == queued) or time.time() > deadline:
            return text
        time.sleep(0.25)


def test_beyond_the_queue_limit_prompts_complete_uncompressed_and_are_counted(server, client, cases):
    """A burst of 8 long prompts on one scorer whose queue takes 3: the first 3 are scored while the rest arrive, and
    those are prefilled as sent at once, each counted as queue_full."""
    case = cases[0]
    before = _before(server)
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: client.completions.create(model="tiny", prompt=case.prompt, max_tokens=2,
                                                                     temperature=0), range(8)))
    sent = [r.usage.prompt_tokens for r in replies]
    uncompressed = sum(n == case.prompt_tokens for n in sent)
    assert 1 <= uncompressed <= 8 - 1 and all(n == case.prompt_tokens or n < 0.5 * case.prompt_tokens for n in sent)
    text = _queue_settled(server, text_metric(before, "vllm:luce_pflash_queued_prompts_total") + 8 - uncompressed)

    def delta(name, **labels):
        return text_metric(text, name, **labels) - text_metric(before, name, **labels)

    assert delta("vllm:luce_pflash_prompts_total", outcome="queue_full") == uncompressed
    assert delta("vllm:luce_pflash_prompts_total", outcome="compressed") == 8 - uncompressed
    assert delta("vllm:luce_pflash_queued_prompts_total") == 8 - uncompressed
    assert delta("vllm:luce_pflash_queue_wait_seconds_total") > 0  # the second and third waited for the first
    assert text_metric(text, "vllm:luce_pflash_queue_depth") == 0


def _on_the_api_server(server) -> tuple[float, float]:
    """(requests waiting on a scoring answer, prompts compressed): the API server's own values, current at every
    scrape (rank 0's queue values lag up to PUBLISH_EVERY_S)."""
    text = scrape(server.base_url)
    return (text_metric(text, "vllm:luce_pflash_waiting_requests"),
            text_metric(text, "vllm:luce_pflash_prompts_total", outcome="compressed"))


def _wait_for(condition, what: str, timeout: float = 60.0):
    deadline = time.time() + timeout
    while not (found := condition()):
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)
    return found


def test_a_client_that_disconnects_while_its_prompt_is_queued_leaves_nothing_held(server, client, cases):
    """Two longer prompts keep the scorer busy; a third client goes away (closes its connection) while its prompt
    waits behind them. Its pass is cancelled, rank 0's queue ends up holding nothing, and the server goes on
    answering. Every step waits on the API server's state, never on a host's speed: the worker scores one prompt at a
    time in submission order, so once both fillers are in, the third waits until both are answered."""
    case = cases[0]
    before = _before(server)
    compressed_before = text_metric(before, "vllm:luce_pflash_prompts_total", outcome="compressed")
    body = {"model": "tiny", "prompt": case.prompt, "max_tokens": 2, "temperature": 0}
    # 1.75x the case's tokens (within max_model_len): the longest passes the server takes
    filler = {**body, "prompt": case.prompt + case.prompt[: len(case.prompt) * 3 // 4]}

    def waiting_once(arrived: int) -> tuple[float] | None:
        """(requests waiting on their pass,) once ``arrived`` requests reached the scorer (waiting, or compressed)."""
        waiting, compressed = _on_the_api_server(server)
        return (waiting,) if waiting + compressed - compressed_before == arrived else None

    with ThreadPoolExecutor(2) as pool:
        fillers = [pool.submit(client.completions.create, **filler) for _ in range(2)]
        _wait_for(lambda: waiting_once(2), "both fillers to reach the scorer")
        url = urllib.parse.urlsplit(server.base_url)
        payload = json.dumps(body).encode()
        with socket.create_connection((url.hostname, url.port)) as third:
            third.sendall(f"POST {url.path}/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
                          f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
            (waiting,) = _wait_for(lambda: waiting_once(3), "the third request to reach the scorer")
            # Answered, it would leave no filler waiting (theirs end first): any request waiting puts it in the queue
            assert waiting >= 1, "the three passes ended before the third client could go away"
        assert all(f.result().choices[0].finish_reason == "length" for f in fillers)
    cancelled_before = text_metric(before, "vllm:luce_pflash_prompts_total", outcome="cancelled")
    _wait_for(lambda: _prompts(server, "cancelled") == cancelled_before + 1, "the third pass to be cancelled")
    assert _prompts(server, "compressed") == compressed_before + 2  # the fillers were scored
    text = _queue_settled(server, text_metric(before, "vllm:luce_pflash_queued_prompts_total") + 3)
    assert text_metric(text, "vllm:luce_pflash_queue_depth") == 0  # the cancelled ticket is gone from the worker
    assert text_metric(text, "vllm:luce_pflash_waiting_requests") == 0
    assert "went away while its prompt was queued or scored" in server.log_text()
    after = client.completions.create(**body)
    assert after.usage.prompt_tokens < case.prompt_tokens  # and the next long prompt is compressed as before


def test_a_client_supplied_skip_value_does_not_become_a_label(server, client):
    before = _prompts(server, "skipped_other")
    client.completions.create(model="tiny", prompt="import os\n", max_tokens=1,
                              extra_body={"vllm_xargs": {"luce_pflash_skip": "client-chosen-label-1234"}})
    text = scrape(server.base_url)
    assert text_metric(text, "vllm:luce_pflash_prompts_total", outcome="skipped_other") == before + 1
    assert "client-chosen-label-1234" not in text


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
