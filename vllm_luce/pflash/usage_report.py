"""What PFlash did to a request's prompts, shown to the client in the response's ``usage.luce_pflash`` (no vLLM
import; docs/pflash.md, "What the client sees").

PFlash hands vLLM the kept tokens, so vLLM's ``usage.prompt_tokens`` counts those. The add_request patch notes each
prompt's record here (``note``): its tokens as sent, the tokens kept and the outcome, one of PFLASH_OUTCOMES.
``UsageMiddleware``, the ASGI middleware vllm-luce adds to vLLM's app with PFlash on (vLLM's ``--middleware``), gives
each HTTP request to /v1/completions and /v1/chat/completions a record set of its own and writes ``luce_pflash``
into that request's usage: the JSON body, or the stream's usage chunk (``stream_options.include_usage``).

The record set goes into a context variable before the request's handler runs, and every task vLLM starts for the
request copies it: one per prompt of a completions request (``merge_async_iterators``), the stream's own, a
keep-alive's. A context variable set inside add_request would stay in the task that ran it, away from the one
that builds the usage. The set lives as long as the HTTP request: the middleware empties it when the response ends
or the client goes away, and a request added outside such an HTTP request (the offline ``LLM``) keeps nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from array import array
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from vllm_luce.metrics.catalog import PFLASH_OUTCOMES

FIELD = "luce_pflash"
PATHS = ("/v1/completions", "/v1/chat/completions")
MIDDLEWARE = "vllm_luce.pflash.usage_report.UsageMiddleware"  # the import path vLLM's --middleware takes


@dataclass(frozen=True)
class Record:
    sent: int | None  # the prompt's tokens as the client sent them (None: a prompt without token ids or embeddings)
    kept: int | None  # the tokens handed to vLLM, which it prefills and counts in usage.prompt_tokens
    outcome: str
    digest: str | None = None  # a compressed prompt's kept tokens, hashed: two prompts kept alike have one digest

    def as_dict(self) -> dict[str, Any]:
        out = {"prompt_tokens_sent": self.sent, "prompt_tokens_kept": self.kept, "outcome": self.outcome}
        return out if self.digest is None else {**out, "kept_digest": self.digest}


def kept_digest(token_ids: Any) -> str:
    """16 hex digits of a hash of the kept token ids: which tokens PFlash kept, in a few bytes of the response."""
    return hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=8).hexdigest()


_records: ContextVar[dict[str, Record] | None] = ContextVar("luce_pflash_records", default=None)


def prompt_tokens(prompt: Any) -> int | None:
    """A prompt's length in tokens: its token ids, else its embeddings' rows; None for anything else."""
    if isinstance(prompt, Mapping):
        for key in ("prompt_token_ids", "prompt_embeds"):
            value = prompt.get(key)
            if value is not None:
                return len(value)
    return None


def note(request_id: str, sent: Any, kept: Any, outcome: str) -> None:
    """Record what PFlash did to the prompt of vLLM request ``request_id`` (``sent``: the prompt as it came, ``kept``:
    the one handed to vLLM) in the HTTP request being served; nothing outside one."""
    if outcome not in PFLASH_OUTCOMES:
        raise ValueError(f"PFlash: outcome {outcome!r} is not one of {PFLASH_OUTCOMES}")
    records = _records.get()
    if records is not None:
        ids = kept.get("prompt_token_ids") if outcome == "compressed" and isinstance(kept, Mapping) else None
        records[request_id] = Record(prompt_tokens(sent), prompt_tokens(kept), outcome,
                                     None if ids is None else kept_digest(ids))


def _total(values: list[int | None]) -> int | None:
    return None if None in values else sum(values)


def usage_field(records: Mapping[str, Record], response_id: str) -> dict[str, Any] | None:
    """``usage.luce_pflash`` of the response ``response_id``: vLLM names a chat request's one prompt by the response's
    id and prompt i of a completions request ``<id>-<i>``. Sums over the prompts, as vLLM's usage sums; one prompt's
    outcome, or with several a ``prompts`` list in prompt order. None when PFlash saw none of them."""
    if response_id in records:
        prompts = [records[response_id]]
    else:
        prompts = []
        while f"{response_id}-{len(prompts)}" in records:
            prompts.append(records[f"{response_id}-{len(prompts)}"])
    if not prompts:
        return None
    field: dict[str, Any] = {"prompt_tokens_sent": _total([p.sent for p in prompts]),
                             "prompt_tokens_kept": _total([p.kept for p in prompts])}
    if len(prompts) == 1:
        field["outcome"] = prompts[0].outcome
        if prompts[0].digest is not None:
            field["kept_digest"] = prompts[0].digest
    else:
        field["prompts"] = [p.as_dict() for p in prompts]
    return field


def _add_to_usage_chunk(body: Any, records: Mapping[str, Record]) -> bool:
    """Write the field into a stream's usage chunk (the one chunk with a usage and no choices); False for any other
    event."""
    if not isinstance(body, dict) or not isinstance(body.get("usage"), dict) or not isinstance(body.get("id"), str):
        return False
    if body.get("choices") != []:
        return False
    field = usage_field(records, body["id"])
    if field is None:
        return False
    body["usage"][FIELD] = field
    return True


def _dumps(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")  # as vLLM's JSON responses


_ID = re.compile(rb'\{\s*"id"\s*:\s*("(?:[^"\\]|\\.)*")')  # the response's id: its first key in vLLM's bodies
_USAGE = re.compile(rb'"usage"\s*:\s*\{')


def rewrite_json(raw: bytes, records: Mapping[str, Record]) -> bytes | None:
    """A non-streamed response's body with the field in its usage; None to send it as it is. The field is spliced in,
    the body never parsed: every other byte stays as it was, and a body of MiBs (prompt logprobs) costs a search, not
    a parse and a rewrite on the API server's event loop. The usage object is the body's last ``"usage": {``: a
    string's quotes are escaped, and the usage comes after the choices."""
    found = _ID.match(raw)
    if found is None:
        return None
    field = usage_field(records, json.loads(found.group(1)))
    if field is None:
        return None
    last = None
    for last in _USAGE.finditer(raw):
        pass
    if last is None:
        return None
    end = last.end()
    rest = raw[end:]
    return raw[:end] + f'"{FIELD}":'.encode() + _dumps(field) + (b"" if rest.lstrip()[:1] == b"}" else b",") + rest


def rewrite_events(raw: bytes, records: Mapping[str, Record]) -> bytes | None:
    """A piece of an event stream with the field in the usage chunk's usage; None to send it as it is. Every other
    event keeps its bytes."""
    if b'"usage"' not in raw:
        return None
    events, changed = raw.split(b"\n\n"), False
    for i, event in enumerate(events):
        if not event.startswith(b"data: {"):
            continue
        try:
            body = json.loads(event[len(b"data: "):])
        except ValueError:
            continue
        if _add_to_usage_chunk(body, records):
            events[i], changed = b"data: " + _dumps(body), True
    return b"\n\n".join(events) if changed else None


def _header(headers: list, name: bytes) -> bytes:
    return next((value for key, value in headers if key.lower() == name), b"")


class UsageMiddleware:
    """A pure ASGI middleware: each HTTP request to ``PATHS`` gets a record set of its own (``note`` writes into it),
    and its response's usage gets the field. JSON bodies are held until complete and sent with their new length;
    an event stream's pieces pass one by one, the usage chunk rewritten."""

    def __init__(self, app: Callable[..., Awaitable[None]]):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") != "http" or not str(scope.get("path", "")).endswith(PATHS):
            await self.app(scope, receive, send)
            return
        records: dict[str, Record] = {}
        token = _records.set(records)
        try:
            await self.app(scope, receive, _Sender(send, records))
        finally:
            records.clear()  # a task of this request that outlives it holds an empty set
            _records.reset(token)


class _Sender:
    """The ``send`` of one HTTP request: rewrites its usage with the request's records."""

    def __init__(self, send: Callable, records: dict[str, Record]):
        self.send, self.records = send, records
        self.mode = "pass"  # "json": held until the body is complete; "events": piece by piece
        self.start: dict | None = None
        self.body = b""

    async def __call__(self, message: dict) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            content_type = _header(message.get("headers", []), b"content-type")
            if content_type.startswith(b"application/json") and self.records:
                self.mode, self.start = "json", message
                return
            self.mode = "events" if content_type.startswith(b"text/event-stream") else "pass"
        elif kind == "http.response.body" and self.mode == "json":
            self.body += message.get("body", b"")
            if message.get("more_body", False):
                return
            body = rewrite_json(self.body, self.records) or self.body
            headers = [(k, v) for k, v in self.start.get("headers", []) if k.lower() != b"content-length"]
            await self.send({**self.start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            message = {"type": "http.response.body", "body": body, "more_body": False}
        elif kind == "http.response.body" and self.mode == "events" and self.records:
            body = rewrite_events(message.get("body", b""), self.records)
            if body is not None:
                message = {**message, "body": body}
        await self.send(message)
