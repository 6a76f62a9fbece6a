"""PFlash's worker side: the drafter lives on the model runner of rank 0 (where the model runs),
loaded when the runner's KV cache is initialised (so a drafter that cannot load stops startup), and
the engine client reaches it through ``collective_rpc``: the API server queues passes (``luce_pflash_start``) and
collects their answers (``luce_pflash_poll``), the offline ``LLM`` compresses in one blocking call
(``luce_pflash_compress``). V1 and Model Runner V2 are bound the same way (both runners reach ``bind`` through the
initialize_kv_cache patch)."""

from __future__ import annotations

from typing import Any

from vllm_luce import metrics
from vllm_luce.log import logger, tag
from vllm_luce.pflash.service import PFlashService
from vllm_luce.pflash.settings import queue_config, scoring_config, selection_config


def bind(runner: Any, luce: Any) -> None:
    if getattr(runner, "luce_pflash", None) is not None:
        return
    if _rank(runner) != 0:  # one scorer per engine: the other ranks' answers are ignored
        runner.luce_pflash = None
        return
    pf = luce.pflash
    model_config = runner.vllm_config.model_config

    def target_tokenizer():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_config.tokenizer, trust_remote_code=model_config.trust_remote_code)

    labels = {"model_name": metrics.model_name(runner.vllm_config)}
    runner.luce_pflash = PFlashService(pf.drafter, runner.device, selection_config(pf), scoring_config(pf),
                                       pf.dtype, target_tokenizer, queue_config(pf), labels)
    logger.info("%s: PFlash drafter %s", tag(), runner.luce_pflash.describe())


def _rank(runner: Any) -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank, get_pp_group

        return get_tensor_model_parallel_rank() + get_pp_group().rank_in_group
    except Exception:  # no distributed state (unit tests)
        return 0


class PFlashWorkerExtension:
    """Mixed into vLLM's worker class through ``parallel_config.worker_extension_cls`` (vLLM's own
    extension point), so the engine client reaches the scorer by name with ``collective_rpc``."""

    def luce_pflash_compress(self, token_ids: list[int]) -> dict[str, Any] | None:
        """Rank 0 answers, other ranks return None. Errors come back as {"error": ...} so a failed
        scoring pass never takes the engine down; the client then sends the prompt uncompressed."""
        service = _service(self)
        return None if service is None else _answer(lambda: service.compress(token_ids).as_dict())

    def luce_pflash_start(self, ticket: str, token_ids: list[int]) -> dict[str, Any] | None:
        """Queue a pass (``PFlashService.start``): ``{"accepted": bool}`` on rank 0 (False: the queue is full), None
        elsewhere. The API server then collects the answer with ``luce_pflash_poll``."""
        service = _service(self)
        return None if service is None else _answer(lambda: {"accepted": service.start(ticket, token_ids)})

    def luce_pflash_poll(self, tickets: list[str], cancels: list[str]) -> dict[str, Any] | None:
        """Cancel ``cancels`` and hand out the answers ready among ``tickets``, in one call for every prompt the API
        server waits for: ``{"answers": {ticket: answer}}`` on rank 0, None elsewhere."""
        service = _service(self)
        return None if service is None else _answer(lambda: {"answers": service.poll(tickets, cancels)})


def _service(worker) -> PFlashService | None:
    """The worker's scorer service: rank 0's, None elsewhere."""
    return getattr(getattr(worker, "model_runner", None), "luce_pflash", None)


def _answer(compute) -> dict[str, Any]:
    try:
        return compute()
    except Exception as e:  # noqa: BLE001 - reported to the client side, which keeps the full prompt
        logger.exception("%s: PFlash scoring failed; the prompt is prefilled uncompressed", tag())
        return {"error": f"{type(e).__name__}: {e}"}


EXTENSION = f"{PFlashWorkerExtension.__module__}.{PFlashWorkerExtension.__qualname__}"
RPC = "luce_pflash_compress"  # blocking (the offline LLM, which adds its requests before it steps)
START, POLL = "luce_pflash_start", "luce_pflash_poll"  # queued, in the background (the API server's AsyncLLM)
