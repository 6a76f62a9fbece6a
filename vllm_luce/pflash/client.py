"""PFlash's scoring on the API server's engine client (``AsyncLLM``): queue a prompt's pass on rank 0's worker,
wait for its answer, give up at the deadline, and cancel it when the request goes away (no vLLM import; the
``add_request`` patch calls ``ScoringClient.of(engine).score``).

One ``ScoringClient`` per engine client. Each prompt costs one call to start its pass; the answers of every
waiting prompt come back through one poller, which asks rank 0 for all of them (and hands it the cancellations)
in a single ``collective_rpc`` at the cadence of ``scoring_queue.poll_delay``, so the calls do not grow with the
number of waiting prompts. The engine core answers the calls between its steps; the pass itself runs on the
worker's scoring thread, so requests already running, or arriving meanwhile, keep being served.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from vllm_luce import metrics
from vllm_luce.log import logger, tag
from vllm_luce.pflash import frontend
from vllm_luce.pflash.scoring_queue import poll_delay
from vllm_luce.pflash.worker import POLL, START

QUEUE_FULL = {"queue_full": True}
DEADLINE = {"deadline": True}


class ScoringClient:
    def __init__(self, engine: Any, timeout_s: float):
        self.engine = engine
        self.timeout_s = timeout_s
        self.pending: dict[str, asyncio.Future] = {}  # ticket -> its answer, for the prompts waiting on a pass
        self.cancels: list[str] = []  # tickets to cancel on the worker at the next poll
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the poller and its wake-up event belong to
        self._wake: asyncio.Event | None = None
        self._poller: asyncio.Task | None = None

    @classmethod
    def of(cls, engine: Any) -> "ScoringClient":
        """The engine client's one ScoringClient (created at its first scored prompt)."""
        client = engine.__dict__.get("_luce_pflash_client")
        if client is None:
            client = cls(engine, float(frontend.settings_of(engine).queue_timeout_s))
            engine.__dict__["_luce_pflash_client"] = client
        return client

    async def score(self, request_id: str, ids: list[int]) -> dict[str, Any] | None:
        """Rank 0's answer for ``ids``: ``Compressed.as_dict``, ``{"error": ...}``, ``QUEUE_FULL`` or ``DEADLINE``
        (each goes to ``frontend.compress``), or None when no rank scores. When the request goes away
        meanwhile (``asyncio.CancelledError``: the client disconnected, or the request was aborted) the pass is
        cancelled on the worker, counted, and the cancellation goes on."""
        ticket = f"{request_id}-{uuid.uuid4().hex[:8]}"
        self._bind_loop()
        try:
            return await asyncio.wait_for(self._start_and_wait(ticket, ids), self.timeout_s)
        except asyncio.TimeoutError:
            self._cancel(ticket)
            return DEADLINE
        except asyncio.CancelledError:
            self._cancel(ticket)
            frontend.count(self.engine, "cancelled")
            logger.info("%s: PFlash: request %s went away while its prompt was queued or scored; pass cancelled",
                        tag(), request_id)
            raise
        except Exception as e:  # noqa: BLE001 - the request goes on uncompressed
            self._cancel(ticket)
            return frontend.rpc_failed(e)

    async def _start_and_wait(self, ticket: str, ids: list[int]) -> dict[str, Any] | None:
        started = frontend.first_answer(await self.engine.collective_rpc(START, args=(ticket, ids)))
        if started is None or "error" in started:
            return started
        if not started["accepted"]:
            return QUEUE_FULL
        answer = asyncio.get_running_loop().create_future()
        self.pending[ticket] = answer
        self._count_waiting()
        self._ensure_poller()
        return await answer

    def _count_waiting(self) -> None:
        metrics.set_gauge("pflash_waiting_requests", len(self.pending), **frontend.labels_of(self.engine))

    def _cancel(self, ticket: str) -> None:
        """Forget ``ticket`` here and cancel it on the worker at the next poll, which comes at once."""
        self.pending.pop(ticket, None)
        self._count_waiting()
        self.cancels.append(ticket)
        self._ensure_poller()
        self._wake.set()

    def _bind_loop(self) -> None:
        """The poller and its wake-up event belong to the running loop: on first use, or when the engine is driven
        from a new event loop (the old loop's waiters are gone; their passes are cancelled)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self.cancels += list(self.pending)
            self.pending.clear()
            self._count_waiting()
            self._loop, self._wake, self._poller = loop, asyncio.Event(), None

    def _ensure_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = self._loop.create_task(self._poll())

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        while self.pending or self.cancels:
            tickets, cancels, self.cancels = list(self.pending), self.cancels, []
            self._wake.clear()
            try:
                reply = frontend.first_answer(await self.engine.collective_rpc(POLL, args=(tickets, cancels)))
                if reply is None or "error" in reply:
                    raise RuntimeError(f"no rank answered the poll ({reply})")
                answers = reply["answers"]
            except Exception as e:  # noqa: BLE001 - the prompts waiting now go on uncompressed
                failed = frontend.rpc_failed(e)
                answers = dict.fromkeys(tickets, failed)
            for ticket, answer in answers.items():
                waiting = self.pending.pop(ticket, None)
                if waiting is not None and not waiting.done():
                    waiting.set_result(answer)
            self._count_waiting()
            if answers:
                quiet_since = loop.time()
            if self.pending and not self.cancels:
                try:
                    await asyncio.wait_for(self._wake.wait(), poll_delay(loop.time() - quiet_since))
                except asyncio.TimeoutError:
                    pass
