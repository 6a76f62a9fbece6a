"""usage.luce_pflash (``pflash/usage_report.py``): the field from a request's records, the rewrite of JSON bodies and
event streams, and the middleware that gives each HTTP request its record set, reaching the tasks vLLM starts for a
request and emptied when the request ends however it ends."""

from __future__ import annotations

import asyncio
import contextvars
import json

import pytest

from vllm_luce.pflash import usage_report as U

LONG = {"type": "token", "prompt_token_ids": list(range(1000))}
KEPT = {"type": "token", "prompt_token_ids": list(range(200))}
SHORT = {"type": "token", "prompt_token_ids": list(range(20))}


def records(**by_id):
    return {rid.replace("_", "-"): U.Record(*values) for rid, values in by_id.items()}


def test_one_prompt_gives_its_counts_and_outcome():
    chat = records(chatcmpl_a=(1000, 200, "compressed"))
    assert U.usage_field(chat, "chatcmpl-a") == {"prompt_tokens_sent": 1000, "prompt_tokens_kept": 200,
                                                 "outcome": "compressed"}
    one = records(cmpl_b_0=(20, 20, "skipped_short_prompt"))  # a completions request names its prompts <id>-<i>
    assert U.usage_field(one, "cmpl-b") == {"prompt_tokens_sent": 20, "prompt_tokens_kept": 20,
                                            "outcome": "skipped_short_prompt"}
    assert U.usage_field(chat, "chatcmpl-other") is None


def test_several_prompts_sum_as_usage_does_and_list_each_in_order():
    several = records(cmpl_c_0=(1000, 200, "compressed"), cmpl_c_1=(20, 20, "skipped_short_prompt"),
                      cmpl_c_2=(900, 900, "queue_full"), cmpl_c_x_beam_0=(5, 5, "kept"))
    field = U.usage_field(several, "cmpl-c")
    assert field["prompt_tokens_sent"] == 1920 and field["prompt_tokens_kept"] == 1120 and "outcome" not in field
    assert [p["outcome"] for p in field["prompts"]] == ["compressed", "skipped_short_prompt", "queue_full"]
    assert field["prompts"][0] == {"prompt_tokens_sent": 1000, "prompt_tokens_kept": 200, "outcome": "compressed"}


def test_an_unknown_count_is_null_and_so_is_its_sum():
    assert U.prompt_tokens({"type": "embeds", "prompt_embeds": [[0.0] * 4] * 7}) == 7
    assert U.prompt_tokens("text") is None
    field = U.usage_field(records(cmpl_d_0=(None, None, "skipped_not_a_token_prompt"),
                                  cmpl_d_1=(30, 30, "skipped_short_prompt")), "cmpl-d")
    assert field["prompt_tokens_sent"] is None and field["prompts"][1]["prompt_tokens_kept"] == 30


def test_a_compressed_prompt_carries_the_digest_of_what_was_kept():
    token = U._records.set({})
    try:
        U.note("chatcmpl-a", LONG, KEPT, "compressed")
        U.note("chatcmpl-b", LONG, {"type": "token", "prompt_token_ids": list(range(1, 201))}, "compressed")
        U.note("chatcmpl-c", SHORT, SHORT, "skipped_short_prompt")
        records = U._records.get()
    finally:
        U._records.reset(token)
    a, b = (U.usage_field(records, rid) for rid in ("chatcmpl-a", "chatcmpl-b"))
    assert a == {"prompt_tokens_sent": 1000, "prompt_tokens_kept": 200, "outcome": "compressed",
                 "kept_digest": U.kept_digest(range(200))}
    assert len(a["kept_digest"]) == 16 and a["kept_digest"] != b["kept_digest"]  # as many kept, not the same ones
    assert "kept_digest" not in U.usage_field(records, "chatcmpl-c")  # the prompt as sent: nothing to tell apart


def test_note_keeps_nothing_outside_an_http_request_and_refuses_an_outcome_outside_the_set():
    U.note("r", LONG, KEPT, "compressed")  # the offline LLM: no record set in the context
    assert U._records.get() is None
    with pytest.raises(ValueError, match="not one of"):
        U.note("r", LONG, KEPT, "a client's word")


def usage_chunk(rid: str) -> bytes:
    return b"data: " + json.dumps({"id": rid, "object": "text_completion", "choices": [],
                                   "usage": {"prompt_tokens": 200, "total_tokens": 204,
                                             "completion_tokens": 4}}).encode()


def test_a_json_body_gets_the_field_in_its_usage_and_others_stay_as_they_are():
    recs = records(chatcmpl_a=(1000, 200, "compressed"))
    body = json.dumps({"id": "chatcmpl-a", "choices": [{"index": 0}], "usage": {"prompt_tokens": 200}}).encode()
    out = json.loads(U.rewrite_json(body, recs))
    assert out["usage"] == {"prompt_tokens": 200, "luce_pflash": {"prompt_tokens_sent": 1000,
                                                                  "prompt_tokens_kept": 200, "outcome": "compressed"}}
    assert out["choices"] == [{"index": 0}]
    assert U.rewrite_json(b'{"error": {"code": 400}}', recs) is None
    assert U.rewrite_json(b"not json", recs) is None
    assert U.rewrite_json(json.dumps({"id": "other", "usage": {}}).encode(), recs) is None


def test_only_the_streams_usage_chunk_is_rewritten_every_other_event_keeps_its_bytes():
    recs = records(cmpl_e_0=(1000, 200, "compressed"))
    text = b'data: {"id":"cmpl-e","choices":[{"text":"x"}],"usage":{"prompt_tokens":200}}'
    piece = b"\n\n".join([text, usage_chunk("cmpl-e"), b"data: [DONE]", b""])
    out = U.rewrite_events(piece, recs).split(b"\n\n")
    assert out[0] == text and out[2:] == [b"data: [DONE]", b""]  # continuous usage carries no field
    assert json.loads(out[1][len(b"data: "):])["usage"]["luce_pflash"]["prompt_tokens_sent"] == 1000
    assert U.rewrite_events(b'data: {"id":"cmpl-e","choices":[{"text":"x"}]}\n\n', recs) is None
    assert U.rewrite_events(b": keep-alive\n\n", recs) is None


async def run_app(app, path="/v1/completions"):
    """Drive an ASGI app through UsageMiddleware; the messages it sent."""
    sent = []

    async def receive():
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    await U.UsageMiddleware(app)({"type": "http", "path": path}, receive, send)
    return sent


def json_response(body: dict):
    raw = json.dumps(body).encode()
    return [{"type": "http.response.start", "status": 200,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]},
            {"type": "http.response.body", "body": raw, "more_body": False}]


async def add_request(request_id: str, prompt: dict, kept: dict, outcome: str):
    """What the add_request patch does, in whatever task vLLM runs it."""
    await asyncio.sleep(0)
    U.note(request_id, prompt, kept, outcome)
    yield request_id


def test_records_noted_in_tasks_vllm_starts_per_prompt_reach_the_response():
    """vLLM's merge_async_iterators runs each prompt's generator in tasks of its own (a context variable set there
    stays there), and its SSE keep-alive advances the stream in tasks too: both see the request's record set."""
    from vllm.utils.async_utils import merge_async_iterators

    seen = {}

    async def app(scope, receive, send):
        gens = [add_request("cmpl-f-0", LONG, KEPT, "compressed"),
                add_request("cmpl-f-1", SHORT, SHORT, "skipped_short_prompt")]
        async for _ in merge_async_iterators(*gens):
            pass
        seen["records"] = dict(U._records.get())
        for message in json_response({"id": "cmpl-f", "choices": [], "usage": {"prompt_tokens": 220}}):
            await send(message)

    sent = asyncio.run(run_app(app))
    assert set(seen["records"]) == {"cmpl-f-0", "cmpl-f-1"}
    start, body = sent
    field = json.loads(body["body"])["usage"]["luce_pflash"]
    assert (field["prompt_tokens_sent"], field["prompt_tokens_kept"]) == (1020, 220)
    assert dict(start["headers"])[b"content-length"] == str(len(body["body"])).encode()


def test_a_context_variable_set_in_a_prompts_task_does_not_reach_the_caller():
    """Why the record set is placed before the request's tasks start: a value set inside one does not come back."""
    var = contextvars.ContextVar("probe", default=None)

    async def child():
        var.set("set in the child")

    async def parent():
        await asyncio.create_task(child())
        return var.get()

    assert asyncio.run(parent()) is None


def test_a_stream_gets_the_field_in_its_usage_chunk():
    """The stream's body runs in a task of its own (Starlette's), each step of it in another with vLLM's SSE
    keep-alive; the prompt is added inside it."""
    from vllm.entrypoints.serve.utils.sse_keep_alive import with_sse_keep_alive

    async def stream():
        async for _ in add_request("chatcmpl-g", LONG, KEPT, "compressed"):
            yield b'data: {"id":"chatcmpl-g","choices":[{}]}\n\n'
        yield usage_chunk("chatcmpl-g") + b"\n\n"
        yield b"data: [DONE]\n\n"

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})

        async def respond():
            async for piece in with_sse_keep_alive(stream(), 30.0):
                await send({"type": "http.response.body", "body": piece, "more_body": True})

        await asyncio.create_task(respond())
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    sent = asyncio.run(run_app(app, "/v1/chat/completions"))
    assert sent[1]["body"] == b'data: {"id":"chatcmpl-g","choices":[{}]}\n\n'
    usage = json.loads(sent[2]["body"].split(b"\n\n")[0][len(b"data: "):])["usage"]
    assert usage["luce_pflash"] == {"prompt_tokens_sent": 1000, "prompt_tokens_kept": 200, "outcome": "compressed",
                                    "kept_digest": U.kept_digest(range(200))}
    assert sent[3]["body"] == b"data: [DONE]\n\n" and sent[4]["body"] == b""


@pytest.mark.parametrize("ending", ["finished", "aborted", "failed"])
def test_the_record_set_is_emptied_when_the_request_ends_however_it_ends(ending):
    """Finished, aborted (the client went away: vLLM cancels the handler) or failed: nothing a request noted is kept
    afterwards, not even by a task of the request that outlives it."""
    held = {}

    async def app(scope, receive, send):
        async for _ in add_request("cmpl-h-0", LONG, KEPT, "compressed"):
            pass
        held["records"] = U._records.get()
        assert held["records"]
        if ending == "aborted":
            raise asyncio.CancelledError
        if ending == "failed":
            raise RuntimeError("engine died")
        for message in json_response({"id": "cmpl-h", "usage": {}}):
            await send(message)

    if ending == "finished":
        asyncio.run(run_app(app))
    else:
        with pytest.raises((asyncio.CancelledError, RuntimeError)):
            asyncio.run(run_app(app))
    assert held["records"] == {} and U._records.get() is None


def test_other_paths_and_requests_without_records_pass_through_untouched():
    body = {"id": "embd-1", "usage": {"prompt_tokens": 3}}

    async def app(scope, receive, send):
        U.note("embd-1", SHORT, SHORT, "skipped_not_a_generation_request")
        for message in json_response(body):
            await send(message)

    assert asyncio.run(run_app(app, "/v1/embeddings")) == json_response(body)

    async def untouched(scope, receive, send):
        for message in json_response({"id": "cmpl-i", "usage": {}}):
            await send(message)

    assert asyncio.run(run_app(untouched)) == json_response({"id": "cmpl-i", "usage": {}})


def test_a_large_body_is_spliced_not_parsed_and_every_other_byte_stays(monkeypatch):
    """A non-streamed body of MiBs (prompt logprobs) gets the field by a search, never a JSON parse of the body (which
    held the API server's event loop for 197 ms on a 5.9 MiB body), in vLLM's compact JSON and with spaces alike."""
    recs = records(cmpl_b=(9000, 900, "compressed"))
    logprobs = [{str(i): {"logprob": -0.5, "rank": 1, "decoded_token": 'say "usage":{ here'}} for i in range(60_000)]
    body = {"id": "cmpl-b", "object": "text_completion", "choices": [{"text": '"usage":{', "index": 0}],
            "prompt_logprobs": logprobs, "usage": {"prompt_tokens": 900, "total_tokens": 904}}
    loads = json.loads

    def small_only(raw, *args, **kwargs):
        assert len(raw) < 1000, "the body was parsed"
        return loads(raw, *args, **kwargs)

    for separators in ((",", ":"), (", ", ": ")):
        raw = json.dumps(body, separators=separators).encode()
        assert len(raw) > 4 << 20
        monkeypatch.setattr(U.json, "loads", small_only)
        out = U.rewrite_json(raw, recs)
        monkeypatch.undo()
        field = U.usage_field(recs, "cmpl-b")
        assert json.loads(out) == {**body, "usage": {"luce_pflash": field, **body["usage"]}}
        at = out.index(b'"luce_pflash"')
        inserted = out[at:].index(b"},") + 2  # the field and its comma
        assert out[:at] + out[at + inserted:] == raw  # nothing else moved
    empty = json.dumps({"id": "cmpl-b", "usage": {}}, separators=(",", ":")).encode()
    assert json.loads(U.rewrite_json(empty, recs))["usage"] == {"luce_pflash": U.usage_field(recs, "cmpl-b")}
