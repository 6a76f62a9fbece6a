"""PFlash on the worker: score a prompt with the drafter where the model runs, select, answer with the
target token ids to prefill (no vLLM import; ``worker.py`` binds it to a vLLM worker)."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import torch

from vllm_luce.pflash.drafter_spec import DrafterSpec
from vllm_luce.pflash.scorer import DrafterScorer, ScoringConfig, choose_dtype
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


class PFlashService:
    def __init__(self, drafter: str, device: torch.device | str, selection: SelectionConfig,
                 scoring: ScoringConfig = ScoringConfig(), dtype: str = "auto",
                 target_tokenizer: Callable[[], Any] | None = None):
        """``target_tokenizer``: loads the target's tokenizer; called only when the drafter has its own."""
        from vllm_luce.pflash.install import has_tokenizer

        t0 = time.perf_counter()
        self.spec = DrafterSpec.load(drafter)
        self.selection = selection
        device = torch.device(device)
        self.scorer = DrafterScorer(self.spec, device, choose_dtype(device, dtype), scoring)
        self.scorer.warm_up()
        self.bridge: TextBridge | None = None
        if has_tokenizer(self.spec) and target_tokenizer is not None:
            from transformers import AutoTokenizer

            target = target_tokenizer()
            mine = AutoTokenizer.from_pretrained(str(self.spec.path))
            if mine.get_vocab() != target.get_vocab():
                self.bridge = TextBridge(target, mine)
        self.load_s = time.perf_counter() - t0
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="luce-pflash")  # one scoring pass at a time
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._jobs: dict[str, tuple[Future, float]] = {}  # ticket -> (pass, when started)

    def describe(self) -> str:
        return (f"{self.spec.path.name} on {self.scorer.device} ({str(self.scorer.dtype)[6:]}, "
                f"{self.scorer.num_layers} layers scored, attention {self.scorer.cfg.attention}, "
                f"{'cross-tokenizer' if self.bridge else 'shared tokenizer'}), loaded in {self.load_s:.2f} s")

    def compress(self, token_ids: list[int]) -> Compressed:
        """Compress now (the caller waits), on the service's thread like a started pass: one scorer, one thread."""
        return self._thread.submit(self._compress_apart, list(token_ids)).result()

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

    def start(self, ticket: str, token_ids: list[int]) -> None:
        """Compress ``token_ids`` on a thread of the service's own (on a GPU, on a CUDA stream of its own), so that
        the engine goes on stepping its other requests meanwhile: a scoring pass inside the engine loop held every
        request arriving behind a long prompt for the whole pass. ``result(ticket)`` answers."""
        now = time.monotonic()
        for stale in [t for t, (job, at) in self._jobs.items() if job.done() and now - at > ABANDONED_S]:
            del self._jobs[stale]  # its client went away before asking
        self._jobs[ticket] = (self._thread.submit(self._compress_apart, list(token_ids)), now)

    def result(self, ticket: str) -> dict[str, Any]:
        """``start``'s answer (``Compressed.as_dict``) once ready, else ``{"pending": True}``; a failed pass raises."""
        if ticket not in self._jobs:
            raise KeyError(f"PFlash: no scoring pass was started as {ticket!r}")
        job = self._jobs[ticket][0]
        if not job.done():
            return {"pending": True}
        del self._jobs[ticket]
        return job.result().as_dict()

    def _compress_apart(self, token_ids: list[int]) -> Compressed:
        if self._stream is None:
            return self._compress(token_ids)
        # A new thread starts on device 0: the scorer's device is set, and its stream (selection reads the scores on
        # the host, which synchronises the stream).
        with torch.cuda.device(self._stream.device), torch.cuda.stream(self._stream):
            return self._compress(token_ids)


ABANDONED_S = 600.0  # a finished pass nobody asked for this long is dropped
