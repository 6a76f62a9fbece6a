"""PFlash on the worker: score a prompt with the drafter where the model runs, select, answer with the
target token ids to prefill (no vLLM import; ``worker.py`` binds it to a vLLM worker)."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from vllm_luce import metrics
from vllm_luce.log import StartupStep, logger, tag
from vllm_luce.pflash.drafter_spec import DrafterSpec, has_tokenizer
from vllm_luce.pflash.scorer import DrafterScorer, ScoringConfig, choose_dtype
from vllm_luce.pflash.scoring_queue import QueueConfig, ScoringQueue
from vllm_luce.pflash.selection import SelectionConfig, select
from vllm_luce.pflash.text_bridge import TextBridge


@dataclass
class Compressed:
    token_ids: list[int]     # what the target prefills
    prompt_tokens: int       # the prompt as sent
    n_chunks: int
    kept_chunks: int
    anchor_chunks: int
    score_ms: float
    select_ms: float
    cross_tokenizer: bool

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def weight_bytes(spec: DrafterSpec, num_layers: int, dtype: torch.dtype) -> int:
    """What the scorer holds on its device: the tensors of its first ``num_layers`` layers, in ``dtype``."""
    return sum(math.prod(shape) for shape in spec.expected_shapes(num_layers).values()) * dtype.itemsize


def load_scorer(spec: DrafterSpec, device: torch.device, dtype: torch.dtype, scoring: ScoringConfig) -> DrafterScorer:
    """The drafter's scorer on ``device``, warmed up; each step announced with its size before it starts."""
    layers = scoring.early_exit_layers or spec.num_layers
    step = StartupStep(f"PFlash: loading the drafter {spec.path.name} onto {device}",
                       f"{weight_bytes(spec, layers, dtype) / 2**30:.2f} GiB, {layers} layers")
    scorer = DrafterScorer(spec, device, dtype, scoring)
    step.done("PFlash: drafter loaded")
    if device.type == "cuda":  # elsewhere nothing compiles
        lengths = ", ".join(map(str, DrafterScorer.WARM_UP_LENGTHS))
        step = StartupStep("PFlash: compiling and tuning the scoring kernels", f"prompts of {lengths} tokens",
                           DrafterScorer.WARM_UP_SECONDS)
        scorer.warm_up()
        step.done("PFlash: scoring kernels ready")
    return scorer


class PFlashService:
    def __init__(self, drafter: str, device: torch.device | str, selection: SelectionConfig,
                 scoring: ScoringConfig = ScoringConfig(), dtype: str = "auto",
                 target_tokenizer: Callable[[], Any] | None = None, queue: QueueConfig = QueueConfig(),
                 metric_labels: dict[str, str] | None = None):
        """``target_tokenizer``: loads the target's tokenizer; called only when the drafter has its own. ``queue``:
        the bound and deadline of started passes. ``metric_labels``: where given, the queue's depth and waiting
        time go to ``/metrics`` with these labels."""
        t0 = time.perf_counter()
        self.spec = DrafterSpec.load(drafter)
        self.selection = selection
        device = torch.device(device)
        self.scorer = load_scorer(self.spec, device, choose_dtype(device, dtype), scoring)
        self.bridge: TextBridge | None = None
        if has_tokenizer(self.spec) and target_tokenizer is not None:
            from transformers import AutoTokenizer

            target = target_tokenizer()
            mine = AutoTokenizer.from_pretrained(str(self.spec.path))
            if mine.get_vocab() != target.get_vocab():
                self.bridge = TextBridge(target, mine)
        self.load_s = time.perf_counter() - t0
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._scoring = threading.Lock()  # one scoring pass at a time: one scorer
        self._cond = threading.Condition()  # guards the queue; wakes the thread
        self._queue = ScoringQueue(queue)
        self._labels, self._published, self._closed = metric_labels, None, False
        self._thread = threading.Thread(target=self._serve, name="luce-pflash", daemon=True)
        self._thread.start()

    def describe(self) -> str:
        return (f"{self.spec.path.name} on {self.scorer.device} ({str(self.scorer.dtype)[6:]}, "
                f"{self.scorer.num_layers} layers scored, attention {self.scorer.cfg.attention}, "
                f"{'cross-tokenizer' if self.bridge else 'shared tokenizer'}), loaded in {self.load_s:.2f} s")

    def device_bytes_after_sizing(self, max_tokens: int) -> int:
        """What a scoring pass of the longest prompt (``max_tokens`` drafter tokens) takes on the device beyond the
        drafter's weights, measured once (``DrafterScorer.peak_bytes``): passes run beside the engine's steps, after
        vLLM has sized the KV cache. 0 off a GPU."""
        if self.scorer.device.type != "cuda":
            return 0
        step = StartupStep("PFlash: measuring the device memory of a scoring pass", f"a prompt of {max_tokens} tokens")
        with self._scoring:
            found = self.scorer.peak_bytes(max_tokens)
        step.done(f"PFlash: a scoring pass of {max_tokens} tokens takes {found / 2**30:.2f} GiB")
        return found

    def compress(self, token_ids: list[int]) -> Compressed:
        """Compress now, in the caller's thread (the offline ``LLM``, which adds its requests one at a time, outside
        the queue); one pass runs at a time, this or a queued one."""
        with self._scoring:
            return self._compress_apart(list(token_ids))

    def _compress(self, token_ids: list[int]) -> Compressed:
        t0 = time.perf_counter()
        if self.bridge is None:
            scores = self.scorer.token_scores(token_ids)
            t1 = time.perf_counter()
            chosen = select(scores, token_ids, self.selection)
            kept = chosen.gather(list(token_ids))
        else:
            bridged = self.bridge.to_drafter(list(token_ids))
            scores = self.scorer.token_scores(bridged.drafter_ids)
            t1 = time.perf_counter()
            chosen = select(scores, bridged.drafter_ids, self.selection)
            kept = self.bridge.to_target(bridged, chosen.spans)
        t2 = time.perf_counter()
        return Compressed(kept, len(token_ids), chosen.n_chunks, len(chosen.kept_chunks),
                          len(chosen.forced["anchor"]), (t1 - t0) * 1e3, (t2 - t1) * 1e3, self.bridge is not None)

    def start(self, ticket: str, token_ids: list[int]) -> bool:
        """Queue ``token_ids`` for a pass on the service's thread (on a GPU, on a CUDA stream of its own), so that the
        engine goes on stepping its other requests meanwhile: a scoring pass inside the engine loop held every
        request arriving behind a long prompt for the whole pass. False when the queue is full (nothing is held);
        ``poll`` answers."""
        with self._cond:
            accepted = self._queue.submit(ticket, list(token_ids))
            self._publish()
            self._cond.notify()
        return accepted

    def poll(self, tickets: list[str], cancels: list[str] = ()) -> dict[str, dict[str, Any]]:
        """Cancel ``cancels``, then hand out the answers ready among ``tickets`` (``Compressed.as_dict``, or
        ``{"error": ...}`` for a failed pass or a ticket the queue holds nothing for); tickets still waiting or
        being scored are left out."""
        with self._cond:
            for ticket in cancels:
                self._queue.cancel(ticket)
            found = self._queue.collect(tickets)
            self._publish()
            self._cond.notify()  # an expiry may be due sooner than the thread's wait
        return {t: {"error": f"PFlash: no scoring pass is held as {t!r} (cancelled, past its deadline, or never "
                             "queued)"} if answer is None else answer for t, answer in found.items()}

    @property
    def queue(self) -> ScoringQueue:
        return self._queue

    def close(self) -> None:
        """Stop the scoring thread once its current pass ends (the queue's waiting prompts are never scored)."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _serve(self) -> None:
        while True:
            with self._cond:
                job = None
                while not self._closed and (job := self._queue.next_pass()) is None:
                    self._publish()  # expiries
                    self._cond.wait(self._queue.seconds_to_next_deadline())
                if job is None:
                    return
                self._publish()
            ticket, token_ids = job
            try:
                with self._scoring:
                    answer = self._compress_apart(token_ids).as_dict()
            except Exception as e:  # noqa: BLE001 - reported to the API server, which keeps the full prompt
                logger.exception("%s: PFlash scoring failed; the prompt is prefilled uncompressed", tag())
                answer = {"error": f"{type(e).__name__}: {e}"}
            with self._cond:
                self._queue.finish(ticket, answer)
                self._publish()

    def _publish(self) -> None:
        """The queue's depth and waiting time in ``/metrics``, once the queue was used (called under the lock)."""
        q = self._queue
        if self._labels is None or not q.accepted + q.refused:
            return
        state = (q.held, q.accepted, q.wait_s)
        if state == self._published:
            return
        self._published = state
        metrics.set_gauge("pflash_queue_depth", q.held, **self._labels)
        metrics.set_total("pflash_queued_prompts", q.accepted, **self._labels)
        metrics.set_total("pflash_queue_wait_seconds", q.wait_s, **self._labels)

    def _compress_apart(self, token_ids: list[int]) -> Compressed:
        if self._stream is None:
            return self._compress(token_ids)
        # A new thread starts on device 0: the scorer's device is set, and its stream (selection reads the scores on
        # the host, which synchronises the stream).
        with torch.cuda.device(self._stream.device), torch.cuda.stream(self._stream):
            return self._compress(token_ids)

