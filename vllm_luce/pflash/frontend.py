"""PFlash on the engine client (API server or offline ``LLM``): decide whether a request's prompt is
compressed, ask the workers to score it, and hand vLLM the shorter prompt.

The client, not the engine core, swaps the prompt, so everything vLLM derives from the prompt after
this point agrees: the scheduler allocates KV for the kept tokens, ``usage.prompt_tokens`` counts
the tokens the target prefilled, and prompt logprobs (when asked for, compression is skipped) would
refer to them. Scoring itself runs on the workers, never on the client's CPU.
"""

from __future__ import annotations

from typing import Any

from vllm_luce import metrics, request_args
from vllm_luce.log import logger, tag
from vllm_luce.metrics.catalog import PFLASH_OUTCOMES

SKIP_KEY = "luce_pflash_skip"      # set by the chat request patch: why a request is never compressed
# Answers of the scoring client (``client.py``) for a prompt that was not scored, and what the log says of each.
UNSCORED = {"queue_full": "the scoring queue is full (luce.pflash.max_queued_prompts)",
            "deadline": "its scoring pass had not ended within luce.pflash.queue_timeout_s"}


def skip_reason(prompt: Any, params: Any, min_prompt_tokens: int) -> str | None:
    """None when the prompt should be compressed, else why not."""
    if not hasattr(params, "structured_outputs"):
        return "not a generation request"
    if not isinstance(prompt, dict) or prompt.get("type", "token") != "token" or "prompt_token_ids" not in prompt:
        return "not a token prompt"
    extra = params.extra_args or {}
    if SKIP_KEY in extra:  # its value only picks the outcome label among a fixed set (``skip_outcome``)
        return str(extra[SKIP_KEY])
    if request_args.declined(params, request_args.PFLASH):  # extra_body={"vllm_xargs": {"luce_pflash": "off"}}
        return "opted out"
    if params.structured_outputs is not None:
        return "response format"
    if params.prompt_logprobs is not None:
        return "prompt logprobs"
    if len(prompt["prompt_token_ids"]) < min_prompt_tokens:
        return "short prompt"
    return None


def admit(engine: Any, prompt: Any, params: Any) -> tuple[list[int] | None, str | None]:
    """(the prompt's token ids, None) when ``engine`` has PFlash on and this request is eligible; (None, the skip's
    outcome, counted) when PFlash skips it; (None, None) with PFlash off."""
    settings = settings_of(engine)
    if settings is None:
        return None, None
    reason = skip_reason(prompt, params, settings.min_prompt_tokens)
    if reason is not None:
        outcome = skip_outcome(reason)
        count(engine, outcome)
        return None, outcome
    return prompt["prompt_token_ids"], None


def skip_outcome(reason: str) -> str:
    """The ``outcome`` label of a skip reason: one of PFLASH_OUTCOMES, ``skipped_other`` for a reason not known
    there (``luce_pflash_skip`` also arrives from clients, in ``vllm_xargs``)."""
    outcome = "skipped_" + reason.replace(" ", "_")
    return outcome if outcome in PFLASH_OUTCOMES else "skipped_other"


def count(engine: Any, outcome: str) -> None:
    """One prompt more with ``outcome``, a value of the fixed set PFLASH_OUTCOMES."""
    if outcome not in PFLASH_OUTCOMES:
        raise ValueError(f"PFlash: outcome {outcome!r} is not one of {PFLASH_OUTCOMES}")
    metrics.inc("pflash_prompts", outcome=outcome, **labels_of(engine))


def labels_of(engine: Any) -> dict[str, str]:
    return {"model_name": metrics.model_name(getattr(engine, "vllm_config", None))}


def rpc_failed(error: BaseException) -> dict[str, Any]:
    logger.warning("%s: PFlash: scoring call failed", tag(), exc_info=error)
    return {"error": f"{type(error).__name__}: {error}"}


def first_answer(results: list[Any]) -> dict[str, Any] | None:
    return next((r for r in results if r is not None), None)


def compress(prompt: dict, answer: dict[str, Any] | None, request_id: str, engine: Any = None) -> tuple[dict, str]:
    """The prompt to send and its outcome, counted: the kept tokens ("compressed"), or the original if the prompt was
    not scored ("queue_full", "deadline"), scoring failed ("failed"), or it kept everything ("kept")."""
    labels = labels_of(engine)
    if answer is None or "error" in answer:
        count(engine, "failed")
        if answer is not None:
            logger.warning("%s: PFlash: request %s prefilled uncompressed: %s", tag(), request_id, answer["error"])
        return prompt, "failed"
    for outcome, why in UNSCORED.items():
        if answer.get(outcome):
            count(engine, outcome)
            logger.info("%s: PFlash: request %s prefilled uncompressed: %s", tag(), request_id, why)
            return prompt, outcome
    kept = answer["token_ids"]
    metrics.inc("pflash_scoring_seconds", (answer["score_ms"] + answer["select_ms"]) / 1e3, **labels)
    logger.info("%s: PFlash: request %s: %d -> %d prompt tokens (%d of %d chunks, %d by anchors; scoring "
                "%.0f ms, selection %.0f ms%s)", tag(), request_id, answer["prompt_tokens"], len(kept),
                answer["kept_chunks"], answer["n_chunks"], answer["anchor_chunks"], answer["score_ms"],
                answer["select_ms"], ", cross-tokenizer" if answer["cross_tokenizer"] else "")
    sent = len(prompt["prompt_token_ids"])
    if len(kept) >= sent:
        count(engine, "kept")
        return prompt, "kept"
    count(engine, "compressed")
    metrics.inc("pflash_prompt_tokens", sent, **labels)
    metrics.inc("pflash_kept_tokens", len(kept), **labels)
    metrics.set_gauge("pflash_compression_ratio", len(kept) / sent, **labels)
    out = {k: v for k, v in prompt.items() if k not in ("prompt", "prompt_token_offsets")}
    out["prompt_token_ids"] = kept
    return out, "compressed"


def settings_of(engine: Any) -> Any | None:
    """The engine's ``luce.pflash`` settings when PFlash is on, else None (cached on the engine)."""
    cached = engine.__dict__.get("_luce_pflash")
    if cached is None:
        from vllm_luce.config import LuceConfig

        pf = LuceConfig.from_vllm_config(engine.vllm_config).pflash
        cached = engine.__dict__["_luce_pflash"] = (pf if pf.enabled else False,)
    return cached[0] or None
