"""KVFlash on the engine client: a prompt whose paged-out KV could never fit one request's share of host memory is
refused before it reaches the engine, with an error that names the setting: HTTP 400, or in a stream already begun
an error event with code 400, as vLLM answers its own admission control's refusals. Let in, it would wait for host
memory forever. The limit is the engine's (``engine_tiers.publish_facts``: its chunk bytes, pool and share)."""

from __future__ import annotations

from typing import Any

# The sampling params' key the engine client sets on a request for ``n`` > 1 samples, before vLLM splits it into n
# children of one params: the children split one share of host memory. Never the client's: always overwritten.
FAMILY = "luce_kvflash_family"
TARGET = "vllm.sampling_params:SamplingParams.extra_args"


def family_of(params: Any) -> int:
    """How many children split the request's share (1 for a request of its own)."""
    extra = getattr(params, "extra_args", None)
    value = extra.get(FAMILY, 1) if extra else 1
    return value if isinstance(value, int) and value > 1 else 1


def mark_family(params: Any) -> None:
    """Set (or clear) ``FAMILY`` from the request's ``n``, whatever the client sent in ``vllm_xargs``."""
    from vllm_luce import hooks

    extra = getattr(params, "extra_args", None)
    n = getattr(params, "n", 1) or 1
    if n > 1:
        hooks.bind(TARGET, params, {**(extra or {}), FAMILY: n})
    elif extra and FAMILY in extra:
        hooks.bind(TARGET, params, {k: v for k, v in extra.items() if k != FAMILY})


def prompt_tokens(prompt: Any) -> int | None:
    """The prompt's token count where the client already knows it (token prompts, processed requests)."""
    ids = getattr(prompt, "prompt_token_ids", None)
    if ids is None and isinstance(prompt, dict):
        ids = prompt.get("prompt_token_ids")
    return None if ids is None else len(ids)


def check(engine: Any, prompt: Any, params: Any) -> None:
    """Raise a ValueError naming ``luce.kvflash.host_request_bytes`` for a prompt KVFlash could never serve (for ``n``
    samples, within a share split ``n`` ways); mark a request for ``n`` samples (``FAMILY``)."""
    from vllm_luce.kvflash.admission import AdmissionConfig
    from vllm_luce.kvflash.engine_tiers import read_facts
    from vllm_luce.request_args import bad_request

    vllm_config = getattr(engine, "vllm_config", None)
    facts = read_facts(vllm_config) if vllm_config is not None else None
    if not facts or not hasattr(params, "max_tokens"):
        return
    mark_family(params)
    family = family_of(params)
    tiers = AdmissionConfig(chunk_tokens=facts["chunk_tokens"], pool_chunks=facts["pool_chunks"],
                            block_size=facts["chunk_tokens"], chunk_bytes=facts["chunk_bytes"],
                            request_bytes=facts["request_bytes"])
    share, chunk, pool = tiers.share(family), facts["chunk_bytes"], facts["pool_tokens"]
    limit = tiers.max_tokens(facts["margin"], family)
    n = prompt_tokens(prompt)
    if n is None or n < limit:
        return
    samples = f", split between the request's n={family} samples" if family > 1 else ""
    raise bad_request(
        f"luce.kvflash.host_request_bytes: this prompt of {n} tokens would page out more KV than one request may hold "
        f"in host memory ({share} bytes{samples}, {chunk} bytes per chunk beyond a pool of {pool} tokens): KVFlash "
        f"serves up to {limit - 1} prompt tokens here; raise luce.kvflash.host_request_bytes or "
        "luce.kvflash.host_bytes")
