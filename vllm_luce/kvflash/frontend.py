"""KVFlash on the engine client: a prompt whose paged-out KV could never fit one request's share of host memory is
refused before it reaches the engine, with an error that names the setting: HTTP 400, or in a stream already begun
an error event with code 400, as vLLM answers its own admission control's refusals. Let in, it would wait for host
memory forever. The limit is the engine's (``engine_tiers.publish_facts``: its chunk bytes, pool and share)."""

from __future__ import annotations

from typing import Any


def prompt_tokens(prompt: Any) -> int | None:
    """The prompt's token count where the client already knows it (token prompts, processed requests)."""
    ids = getattr(prompt, "prompt_token_ids", None)
    if ids is None and isinstance(prompt, dict):
        ids = prompt.get("prompt_token_ids")
    return None if ids is None else len(ids)


def check(engine: Any, prompt: Any, params: Any) -> None:
    """Raise a ValueError naming ``luce.kvflash.host_request_bytes`` for a prompt KVFlash could never serve."""
    from vllm_luce.kvflash.engine_tiers import read_facts
    from vllm_luce.request_args import bad_request

    vllm_config = getattr(engine, "vllm_config", None)
    facts = read_facts(vllm_config) if vllm_config is not None else None
    if not facts or not hasattr(params, "max_tokens"):
        return
    n = prompt_tokens(prompt)
    if n is None or n < facts["max_tokens"]:
        return
    raise bad_request(
        f"luce.kvflash.host_request_bytes: this prompt of {n} tokens would page out more KV than one request may hold "
        f"in host memory ({facts['request_bytes']} bytes, {facts['chunk_bytes']} bytes per chunk beyond a pool of "
        f"{facts['pool_tokens']} tokens): KVFlash serves up to {facts['max_tokens'] - 1} prompt tokens here; raise "
        "luce.kvflash.host_request_bytes or luce.kvflash.host_bytes")
