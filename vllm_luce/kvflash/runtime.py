"""KVFlash's per-worker runtime: one pager per request, planned each step (knows nothing of a particular runner).

Per step, before the forward (``plan``):
  * each scheduled request's pager makes room for its new tokens (page-out, compaction, and every
    ``tau`` decoded tokens a reselection that pages chunks back in), then returns their pool offsets;
  * those become the slot mapping of the pooled KV cache group (the new K/V land in the pool);
  * the group's attention metadata gets ``seq_lens`` = resident tokens, so vLLM's own paged
    attention reads exactly the compacted pool (``pager.py``).
With selection ``sfi`` a ``RequestSelection`` (``sfi.py``) stands in for the pager: all KV stays
resident and a fast step's attention reads a suffix of the request's block row (the builder drops
the row's first ``skipped_tokens() // block_size`` blocks).
After the forward, the pooled layers' queries of each request's last token (and, in steps with several
tokens of a request, of its last ``query_window`` tokens) are kept (on the device) for the policies.
Finished and preempted requests release their pagers (and host pages).

CUDA graphs replay the device addresses they captured, and vLLM captures whole decode steps (FULL graphs:
FlashAttention reads ``seq_lens`` as ``seqused_k`` inside the graph) with no Python run on replay. So every
tensor a step's attention or query capture reads or writes lives in a buffer of fixed address that each
step overwrites (``graph_buffer``, the rows and query buffers), never in a tensor made for the step: with
new tensors a replayed step read the resident lengths and wrote the queries of whatever the captured
addresses held.

``worker_v1.py`` (Model Runner V1) and ``worker_v2.py`` attach it to vLLM's two model runners, with the pieces both
share (``worker.py``).
"""

from __future__ import annotations

import functools
import time
from types import SimpleNamespace

import numpy as np
import torch

from vllm_luce import metrics
from vllm_luce.kernels.scored_dims import ScoredDims
from vllm_luce.kvflash.admission import AdmissionConfig
from vllm_luce.kvflash.choices import ChoiceLog
from vllm_luce.kvflash.device_budget import DeviceNeeds, device_bytes
from vllm_luce.kvflash.host_pool import PinnedChunkPool
from vllm_luce.kvflash.kv_store import PagedPoolStore, copy_stream_for, to_device_async
from vllm_luce.kvflash.pager import PagerConfig, RequestPager
from vllm_luce.kvflash.pool_store import PagerStats, summarize
from vllm_luce.kvflash.plan import SFI
from vllm_luce.kvflash.policies import make_policy
from vllm_luce.kvflash.query_window import push_queries, window_rows
from vllm_luce.kvflash.settings import longest_page_out, resolve_pinned_bytes, resolve_request_bytes
from vllm_luce.kvflash.sfi import RequestSelection
from vllm_luce.log import StartupStep, logger, tag

PIN_BYTES_PER_S = 1.1 * 2**30  # what a host pins a second, for the start line's estimate (docs/kvflash.md, Limits)


class KVFlashRuntime:
    def __init__(self, config: PagerConfig, policy_name: str, caches: list[torch.Tensor], layout: TokenLayout,
                 head_size: int, block_size: int, max_num_reqs: int, scorer=None, reduce_max=None,
                 host_budget: int | None = None, metric_labels: dict | None = None, selection: str = "page",
                 query_window: int = 1, scored_dims: ScoredDims = ScoredDims(), host_pinned: int | str = 0,
                 max_model_len: int = 0, ledger=None, engine: int = 0, draft_tokens: int = 0,
                 host_request: int | str = "auto", ranks: int = 1, audit=None, tokens_of=None,
                 log_choices: bool = False, verify_pages: bool = False):
        self.config, self.layout, self.head_size, self.block_size = config, layout, head_size, block_size
        self.tokens_of = tokens_of  # request -> (prompt and output token ids, prompt length), for a policy scorer
        self.selection = selection
        self.caches = caches
        self.policy = make_policy(policy_name, scorer, reduce_max, scored_dims)
        self.pagers: dict[str, RequestPager] = {}
        self.resident_lens = torch.zeros(max_num_reqs, dtype=torch.int32)
        self.skip_blocks = torch.zeros(max_num_reqs, dtype=torch.int64)  # SFI: leading blocks attention skips
        self.step_req_ids: list[str] = []
        self.step_last_rows: np.ndarray = np.zeros(0, dtype=np.int64)  # last token of each scheduled row
        self.max_num_reqs = max_num_reqs
        self._rows: torch.Tensor | None = None  # device [max_num_reqs]: this step's last-token rows (0 beyond)
        self._safe_rows: torch.Tensor | None = None  # the same, within the forward's token count
        self._loaded_rows: np.ndarray | None = None  # what ``_rows`` holds
        self._first_layer: int | None = None
        self._queries: dict[int, torch.Tensor] = {}  # pooled layer -> device [max_num_reqs, q_heads, head]
        self.query_window = query_window  # tokens whose queries a reselection scores with (query_window.py)
        # tokens whose queries a step hands its pagers: the window, and as many again as drafts a verify step may reject
        self.query_keep = query_window + draft_tokens
        self._window: tuple | None = None  # this step's (device rows, (first, count) per request), if any
        self._window_queries: dict[int, torch.Tensor] = {}  # pooled layer -> [window rows, q_heads, head]
        self._buffers: dict[str, torch.Tensor] = {}  # graph_buffer's
        self.host_bytes_released = 0
        self.released = PagerStats()  # totals of released pagers
        self.host_budget = host_budget  # host_full 'drop': bytes of paged-out KV this worker may hold, else None
        self.ledger, self.engine = ledger, engine  # the host's ledger (host_ledger.py) and this engine's tag in it
        self.metric_labels = metric_labels or {}
        self._reported_at = 0.0
        self._host_pools: dict[tuple, PinnedChunkPool] = {}
        self.host_pinned = host_pinned  # bytes or 'auto' the warm-up pins for page-outs (luce.kvflash.host_pinned_bytes)
        self.host_request, self.ranks = host_request, ranks  # luce.kvflash.host_request_bytes; the engine's workers
        self.max_model_len = max_model_len
        # what the scheduler's admission reserves host memory by (``admission.py``): chunks, whatever their bytes
        self.audit = audit  # audit.Audit with luce.kvflash.audit where the runner's binding audits (V1), else None
        self.log_choices = log_choices  # luce.kvflash.log_choices, on one rank of the engine (``choices.py``)
        self.verify_pages = verify_pages  # luce.kvflash.verify_pages: each paged-in chunk checked against its page-out
        self.tiers = AdmissionConfig(chunk_tokens=config.chunk_tokens, pool_chunks=config.pool_chunks,
                                     block_size=block_size, chunk_bytes=0, request_bytes=0)

    @property
    def sfi(self) -> bool:
        """Selection 'sfi' (``plan.KVFlashPlan.sfi``): every block resident, decode attends to the pool."""
        return self.selection == SFI

    def pager(self, req_id: str) -> RequestPager | RequestSelection:
        pager = self.pagers.get(req_id)
        if pager is None:
            store = self._new_store()
            if self.sfi:
                pager = RequestSelection(self.config, store, align_tokens=self.block_size)
            else:
                pager = RequestPager(self.config, store, choices=ChoiceLog() if self.log_choices else None,
                                     page_sums={} if self.verify_pages else None)
            self.pagers[req_id] = pager
            pager.req_id = req_id
            if self.host_budget is not None and not self.sfi:  # SFI pages nothing out
                pager.host_allowance = functools.partial(self._host_allowance, pager)
        return pager

    def _new_store(self) -> PagedPoolStore:
        store = PagedPoolStore(self.caches, self.layout, self.head_size, self.block_size, self.config.chunk_tokens)
        store.host_pool = self.host_pool
        return store

    def warm_up(self, q_heads: int | None = None) -> None:
        """On a GPU, at startup: pin ``host_pinned`` bytes of slabs for page-outs (``pin_host_memory``), then page one
        chunk of vLLM's null block (block 0) out and back in, and summarise and score it as the policy does
        (``q_heads``: this rank's query heads), so that the first long prompt does not compile the paging and scoring
        kernels (vLLM's JIT monitor caught the salient kernel compiling on the first request)."""
        if not self.caches or self.caches[0].device.type != "cuda" or self.sfi:
            return
        store = self._new_store()
        store.row = np.zeros(-(-self.config.chunk_tokens // self.block_size), dtype=np.int64)
        chunk = store.read(0)  # a page-out's shape and dtype
        self.pin_host_memory(tuple(chunk.shape), chunk.dtype)
        step = StartupStep("KVFlash: compiling the paging and scoring kernels",
                           f"a chunk of {self.config.chunk_tokens} tokens out and back on {len(self.caches)} layers")
        try:
            host = store.read_host(0)
            store.synchronize()
            store.write(0, host)  # the same bytes back
            self.warm_up_policy(store, q_heads)
            torch.cuda.synchronize(self.caches[0].device)
            step.done("KVFlash: kernels compiled")
        except Exception as error:  # noqa: BLE001 - a slower first request, not a reason to stop the server
            logger.warning("%s: KVFlash: warm-up failed (the first request compiles instead): %s", tag(), error)

    def pin_host_memory(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        """Pin ``host_pinned`` bytes of whole chunks for page-outs, within what the host ledger leaves, before the
        server serves (never while it serves: ``host_pool.py``); held in the ledger as this worker's pinned bytes. A
        failure to pin is reported as such: page-outs then copy to pageable memory, slower, nothing is lost.

        Pinned memory stays the server's until it exits, so pinning leaves one request's share of the budget unheld
        (``host_request_bytes`` of this engine): however many servers pinned before, a request of any server on the
        host can still be given its share, as others' page-outs come back."""
        chunk_bytes = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        budget = self.ledger.budget if self.ledger is not None else self.host_budget
        wanted = resolve_pinned_bytes(self.host_pinned, budget, chunk_bytes, self.max_model_len,
                                      self.config.pool_tokens, self.config.chunk_tokens) // chunk_bytes * chunk_bytes
        if not wanted:
            return
        leave = 0 if self.ledger is None else resolve_request_bytes(
            self.host_request, budget, longest_page_out(self.max_model_len, self.config.pool_tokens,
                                                        self.config.chunk_tokens, chunk_bytes * self.ranks))
        granted = wanted if self.ledger is None else \
            self.ledger.hold_up_to("pinned", wanted, self.engine, leave=leave) // chunk_bytes * chunk_bytes
        if granted < wanted:
            logger.warning("%s: KVFlash: the host's budget (luce.kvflash.host_bytes, %.1f GiB, shared through %s) "
                           "leaves %.1f of the %.1f GiB to pin (luce.kvflash.host_pinned_bytes), keeping one "
                           "request's share (%.1f GiB) unpinned; page-outs beyond it copy to pageable memory", tag(),
                           budget / 2**30, self.ledger.path, granted / 2**30, wanted / 2**30, leave / 2**30)
        if not granted:
            return
        step = StartupStep("KVFlash: pinning host memory for paged-out KV", f"{granted / 2**30:.1f} GiB",
                           granted / PIN_BYTES_PER_S)
        pool = self.host_pool(shape, dtype)
        try:
            pool.reserve(granted)
        except (RuntimeError, MemoryError) as error:
            logger.error("%s: KVFlash: could not pin %.1f GiB of host memory (luce.kvflash.host_pinned_bytes): %s; "
                         "%.1f GiB pinned, page-outs beyond it copy to pageable memory", tag(), granted / 2**30,
                         error, pool.pinned_bytes / 2**30)
        if self.ledger is not None:
            self.ledger.hold("pinned", pool.pinned_bytes, self.engine)
        step.done(f"KVFlash: pinned {pool.pinned_bytes / 2**30:.1f} GiB")

    def warm_up_policy(self, store, q_heads: int | None) -> None:
        """The policy's summary of ``store``'s first chunk, scored with zero queries of a reselection's shape. A copy
        of the policy without the tensor-parallel reduction scores: no collective where a rank may fail alone."""
        if not getattr(self.policy, "needs_summaries", False):
            return
        summary = summarize(self.policy, store, 0)
        if q_heads and getattr(self.policy, "needs_queries", False):
            queries = torch.zeros(len(self.caches), q_heads * self.query_window, self.head_size,
                                  device=summary.device)
            probe = SimpleNamespace(queries=queries, summaries={0: summary}, last_used={})
            dims = {"scored": self.policy.scored} if hasattr(self.policy, "scored") else {}
            type(self.policy)(**dims).scores(probe, [0])  # the policy's scored dims, but no collective

    def device_bytes_after_sizing(self, capacity_blocks: int, q_heads: int | None) -> int:
        """The most this runtime holds on the device once vLLM has sized the KV cache (``device_budget.py``), for a
        cache of ``capacity_blocks`` blocks at most and ``q_heads`` query heads on this rank (None: as many as KV
        heads)."""
        if not self.caches:
            return 0
        store = self._new_store()
        chunk_bytes = store.chunk_nbytes()
        host = self.ledger.budget // (chunk_bytes * self.ranks) if self.ledger is not None and chunk_bytes else 0
        kv_heads = self.caches[0].shape[1]
        scored = getattr(self.policy, "scored", ScoredDims())
        return device_bytes(DeviceNeeds(
            policy=self.policy.name if getattr(self.policy, "needs_summaries", False) else "none",
            selection=self.selection, layers=len(self.caches), kv_heads=kv_heads, q_heads=q_heads or kv_heads,
            head=self.head_size, scored=scored.count(self.head_size), chunk_tokens=self.config.chunk_tokens,
            pool_chunks=self.config.pool_chunks, chunk_bytes=chunk_bytes, block_size=self.block_size,
            max_num_reqs=self.max_num_reqs, max_model_len=self.max_model_len, query_keep=self.query_keep,
            capacity_blocks=capacity_blocks, host_chunks=0 if self.sfi else host))

    def host_pool(self, shape: tuple[int, ...], dtype: torch.dtype) -> PinnedChunkPool:
        """The worker's pinned pool for chunks of ``shape``, shared by its requests and kept between them."""
        pool = self._host_pools.get((shape, dtype))
        if pool is None:
            pool = self._host_pools[(shape, dtype)] = PinnedChunkPool(shape, dtype, copy_stream_for(self.caches[0].device))
        return pool

    def _host_allowance(self, pager: RequestPager, nbytes: int) -> bool:
        """host_full 'drop': this worker's share of the host budget."""
        if self.host_bytes() + nbytes <= self.host_budget:
            return True
        if not pager.stats.dropped:
            logger.warning("%s: KVFlash: this worker's share of the host budget (luce.kvflash.host_bytes, %d bytes) "
                           "is spent and luce.kvflash.host_full is 'drop': request %s drops its coldest chunks",
                           tag(), self.host_budget, getattr(pager, "req_id", "?"))
        return False

    def plan(self, req_ids: list[str], query_start_loc: np.ndarray, starts: np.ndarray, rows: np.ndarray,
             num_blocks: np.ndarray, num_prompt_tokens: np.ndarray) -> np.ndarray:
        """Run every scheduled request's pager for this step (``starts``: each request's first scheduled
        position); returns the slot mapping of the step's tokens (int64, one per token) and fills
        ``resident_lens``."""
        self._collect_queries()
        slots = np.full(int(query_start_loc[len(req_ids)]), -1, dtype=np.int64)
        for r, req_id in enumerate(req_ids):
            lo, hi = int(query_start_loc[r]), int(query_start_loc[r + 1])
            pager = self.pager(req_id)
            pager.store.row = rows[r, : num_blocks[r]]
            if hi > lo:
                start = int(starts[r])
                decoded = max(0, hi - lo - max(0, int(num_prompt_tokens[r]) - start))
                prompt_end = hi - lo == 1 and start + 1 == int(num_prompt_tokens[r])
                pager.prompt_tokens = int(num_prompt_tokens[r])
                offsets = pager.prepare(start, hi - lo, self.policy, decoded=decoded, prompt_end=prompt_end)
                slots[lo:hi] = pager.store.slots(offsets)
                if not self.sfi:  # what the scheduler reserved for its length and block row
                    room = max(pager.num_tokens, pager.room_tokens)
                    pager.check_host_reservation(self.tiers.host_chunks(room, len(pager.store.row)))
            self.resident_lens[r] = pager.resident_tokens()
            self.skip_blocks[r] = pager.skipped_tokens() // self.block_size
        self.step_req_ids = list(req_ids)
        self._plan_window(query_start_loc, len(req_ids))
        self.report_metrics()
        self.step_last_rows = np.asarray(query_start_loc[1: len(req_ids) + 1], dtype=np.int64) - 1
        if self._rows is not None:
            self._load_rows()
        return slots

    def observe_queries(self, layer: int, query: torch.Tensor) -> None:
        """Called by each pooled layer with its post-RoPE queries [tokens, q_heads, head] (QK, attention): the
        rows of each request's last token go to the layer's query buffer, by rows read from the rows buffer (a
        replayed graph gathers this step's rows into the same buffer). Never waits for the forward."""
        if not getattr(self.policy, "needs_queries", False):
            return
        if self._rows is None:
            self._rows = torch.zeros(self.max_num_reqs, dtype=torch.int64, device=query.device)
            self._safe_rows = torch.zeros_like(self._rows)
            self._first_layer = layer  # a forward runs the pooled layers in one order: this one comes first
            self._load_rows()
        buf = self._queries.get(layer)
        if buf is None or buf.shape[1:] != query.shape[1:] or buf.dtype != query.dtype:
            buf = self._queries[layer] = torch.zeros((self.max_num_reqs, *query.shape[1:]), dtype=query.dtype,
                                                     device=query.device)
        n = min(query.shape[0], self.max_num_reqs)  # a graph of n tokens holds at most n requests
        if layer == self._first_layer:  # once a forward, not once a layer: the clamp is a kernel of its own
            torch.clamp(self._rows[:n], max=query.shape[0] - 1, out=self._safe_rows[:n])
        torch.index_select(query, 0, self._safe_rows[:n], out=buf[:n])
        if self._window is not None and not (query.is_cuda and torch.cuda.is_current_stream_capturing()):
            # steps with several tokens of a request run attention outside CUDA graphs; a replay skips this
            self._window_queries[layer] = query.index_select(0, self._window[0].clamp(max=query.shape[0] - 1))

    def _plan_window(self, query_start_loc: np.ndarray, num_reqs: int) -> None:
        """This step's window rows (``query_window.window_rows``), on the queries' device once one is known."""
        self._window_queries = {}
        found = window_rows(query_start_loc, num_reqs, self.query_keep) \
            if getattr(self.policy, "needs_queries", False) else None
        if found is None:
            self._window = None
            return
        device = next(iter(self._queries.values())).device if self._queries else self.caches[0].device
        self._window = (to_device_async(torch.from_numpy(found[0]), device), found[1])

    def _load_rows(self) -> None:
        """This step's last-token rows into the device buffer, unless it holds them already (decode steps of the
        same requests have the same rows)."""
        n = min(len(self.step_last_rows), self.max_num_reqs)
        if self._loaded_rows is not None and np.array_equal(self._loaded_rows, self.step_last_rows[:n]):
            return
        rows = torch.zeros(self.max_num_reqs, dtype=torch.int64)
        rows[:n] = torch.from_numpy(self.step_last_rows[:n])
        self._rows.copy_(to_device_async(rows, self._rows.device))
        self._loaded_rows = self.step_last_rows[:n].copy()

    def _collect_queries(self) -> None:
        """The last step's queries into the pagers that may score them (a copy: the buffers hold the next step's).
        A decode step's go only to pagers near a reselection or an eviction (``RequestPager.wants_queries``): the
        stacking and copying every step was host work of every request on every step."""
        n = min(len(self.step_req_ids), self.max_num_reqs)
        if not self._queries or not n:
            return
        spans = None
        if self._window is not None and len(self._window_queries) == len(self._queries):
            spans = self._window[1]
        wanted = [(r, self.pagers[req_id]) for r, req_id in enumerate(self.step_req_ids[:n]) if req_id in self.pagers
                  and (spans is not None or self.pagers[req_id].wants_queries(self.query_window))]
        if not wanted:
            return
        layers = sorted(self._queries)
        stacked = torch.stack([self._queries[k][:n] for k in layers], dim=1).float()  # [n, L, H, D]
        window = torch.stack([self._window_queries[k] for k in layers], dim=1).float() if spans is not None else None
        for r, pager in wanted:
            first, count = spans[r] if spans is not None else (0, 0)
            latest = window[first : first + count] if count else stacked[r : r + 1]
            push_queries(pager, latest, self.query_window, self.query_keep)

    def graph_buffer(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """A tensor shaped like ``like`` at an address that stays while shapes fit (``max_num_reqs`` rows or
        more): what attention reads under CUDA graphs."""
        buf = self._buffers.get(name)
        if (buf is None or buf.shape[0] < like.shape[0] or buf.shape[1:] != like.shape[1:] or buf.dtype != like.dtype
                or buf.device != like.device):
            buf = self._buffers[name] = torch.zeros((max(like.shape[0], self.max_num_reqs), *like.shape[1:]),
                                                    dtype=like.dtype, device=like.device)
        return buf[: like.shape[0]]

    def give_back(self, req_id: str, row: np.ndarray, keep: int) -> int:
        """The scheduler took back the blocks of the request's row after its first ``keep`` (``row``: the whole row
        before, as ``plan`` gets it): the pager moves its cold chunks there to free positions below, else to host
        memory, while the store still reads them. Returns the chunks moved to host memory."""
        pager = self.pagers.get(req_id)
        if pager is None:
            return 0
        pager.store.row = row
        moved = pager.give_back(keep * self.block_size // self.config.chunk_tokens)
        pager.store.row = row[:keep]
        return moved

    def release(self, req_ids) -> None:
        """Forget finished or preempted requests; their totals move to ``released``. Metrics are published
        at once only when a pager went (called twice every step, mostly with nothing to release)."""
        released = False
        for req_id in req_ids:
            if hasattr(self.policy, "release"):
                self.policy.release(req_id)
            pager = self.pagers.pop(req_id, None)
            if getattr(pager, "choices", None) is not None and pager.choices.entries:
                logger.info("%s: KVFlash chunk choices of request %s: %s", tag(), req_id, pager.choices.line())
            if pager is not None:
                released = True
                for k, v in vars(pager.stats).items():
                    setattr(self.released, k, getattr(self.released, k) + v)
                self.host_bytes_released += pager.release()
        if released:
            self.report_metrics(force=True)

    def host_bytes(self) -> int:
        return sum(p.host_bytes() for p in self.pagers.values())

    def pinned_bytes(self) -> int:
        """Host memory pinned for page-outs: the pools' slabs, in use or kept for later requests."""
        return sum(pool.pinned_bytes for pool in self._host_pools.values())

    def pageable_page_outs(self) -> int:
        """Page-outs that went to pageable memory: every view pinned at startup was in use (``host_pool.py``)."""
        return sum(pool.misses for pool in self._host_pools.values())

    def stats(self) -> dict[str, float]:
        keys = ("page_outs", "page_ins", "cold_outs", "cold_ins", "demotions", "bytes_out", "bytes_in", "moves",
                "reselections", "dropped", "lost", "host_over_reserved", "uncut_decisions", "reselect_s", "sparse_steps",
                "page_mismatches",
                "dense_steps", "attended_tokens", "context_tokens")
        totals = {k: getattr(self.released, k) + sum(getattr(p.stats, k) for p in self.pagers.values()) for k in keys}
        return totals if self.audit is None else {**totals, **self.audit.stats()}

    def publish_metrics(self) -> None:
        """The totals as of now, in ``/metrics`` at the next scrape (``report_metrics`` waits up to 1.5 s)."""
        self.report_metrics(force=True)
        metrics.flush()

    def report_metrics(self, force: bool = False, every_s: float = 0.5) -> None:
        """Publish residency and paging totals (``vllm:luce_kvflash_*``), at most every ``every_s``."""
        now = time.monotonic()
        if not force and now - self._reported_at < every_s:
            return
        self._reported_at = now
        labels, stats = self.metric_labels, self.stats()
        metrics.set_gauge("kvflash_requests", len(self.pagers), **labels)
        metrics.set_gauge("kvflash_resident_chunks", sum(len(p.resident) for p in self.pagers.values()), **labels)
        metrics.set_gauge("kvflash_host_chunks", sum(len(p.host) for p in self.pagers.values()), **labels)
        metrics.set_gauge("kvflash_cold_chunks", sum(len(getattr(p, "cold", ())) for p in self.pagers.values()),
                          **labels)
        metrics.set_gauge("kvflash_host_bytes", self.host_bytes(), **labels)
        metrics.set_gauge("kvflash_pinned_bytes", self.pinned_bytes(), **labels)
        metrics.set_total("kvflash_pageable_page_outs", self.pageable_page_outs(), **labels)
        for name, key in (("page_outs", "page_outs"), ("page_ins", "page_ins"), ("cold_page_outs", "cold_outs"),
                          ("cold_demotions", "demotions"),
                          ("page_out_bytes", "bytes_out"),
                          ("page_in_bytes", "bytes_in"), ("reselections", "reselections"),
                          ("reselection_seconds", "reselect_s"), ("host_budget_drops", "dropped"),
                          ("lost_chunks", "lost"), ("host_over_reserved_chunks", "host_over_reserved"),
                          ("page_mismatches", "page_mismatches"),
                          ("uncut_decisions", "uncut_decisions"),
                          ("sfi_sparse_steps", "sparse_steps"), ("sfi_dense_steps", "dense_steps")):
            metrics.set_total("kvflash_" + name, stats[key], **labels)
