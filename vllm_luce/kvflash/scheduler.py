"""KVFlash's scheduler hooks: a paged request's steps end at its decision positions (``decisions.py``), and the
tiers of cold chunks (``engine_tiers.py``): the KVFlash managers lend free blocks and reserve host memory, each step
ends by returning what it did not allocate, and a request's length stops where its host share ends.

vLLM's scheduler clips each request's chunk in ``_mamba_block_aligned_split`` (0.26 through 0.33, the same
signature; see LEDGER), called only when ``need_mamba_block_aligned_split`` is set (Mamba prefix caching in
"align" mode, which KVFlash never runs with: it turns prefix caching off). The mixin sets the flag, runs
vLLM's alignment where vLLM wanted it, then ``Decisions.cut``. Without paged KVFlash it does
nothing. It is part of every vllm-luce scheduler class (the DFlash gate's included).
"""

from __future__ import annotations

import time

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_luce.kvflash.decisions import Decisions

TARGET = "vllm.v1.core.sched.scheduler:Scheduler._mamba_block_aligned_split"


class KVFlashSchedulerMixin:
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from vllm_luce.config import LuceConfig
        from vllm_luce.kvflash.plan import plan_of

        luce = LuceConfig.from_vllm_config(self.vllm_config)
        plan = plan_of(luce, self.vllm_config) if luce.kvflash.enabled else None
        # the pool size in tokens when paged KVFlash is on, else None
        self._luce_pool_tokens = plan.pager.pool_tokens if plan is not None and plan.pages else None
        self._luce_pager = plan.pager if self._luce_pool_tokens is not None else None
        self._luce_vllm_aligns = self.need_mamba_block_aligned_split
        self.luce_admission = None
        if self._luce_pool_tokens is not None:
            from vllm_luce.hook_ledger import check_signature, ledger_signature

            check_signature(TARGET, Scheduler._mamba_block_aligned_split, ledger_signature(TARGET))
            from vllm_luce import hooks, metrics
            from vllm_luce.kvflash.engine_tiers import build_admission

            hooks.bind("vllm.v1.core.sched.scheduler:Scheduler.need_mamba_block_aligned_split", self, True)
            self.luce_admission = build_admission(self, luce, plan)
            parallel = self.vllm_config.parallel_config
            self._luce_tier_labels = {"model_name": metrics.model_name(self.vllm_config),
                                      "engine": getattr(parallel, "data_parallel_rank", 0)}

    def add_request(self, request) -> None:
        """A request stops where its context would need more host memory than its share (finish reason length),
        as at max_model_len; a prompt that alone would is refused by the frontend (``kvflash/frontend.py``), or where
        that did not see it, ends with an error at this step's outputs. The children of a request for ``n`` samples
        split one share (``frontend.FAMILY``)."""
        from vllm_luce.kvflash.frontend import family_of

        admission = getattr(self, "luce_admission", None)
        limit = None
        if admission is not None:
            family = family_of(request.sampling_params)
            admission.join(request.request_id, family)
            limit = admission.config.max_tokens(getattr(self, "num_lookahead_tokens", 0) or 0, family)
        if limit is not None and request.num_prompt_tokens + request.max_tokens > limit:
            from vllm_luce import hooks

            hooks.bind("vllm.v1.request:Request.max_tokens", request, max(1, limit - request.num_prompt_tokens))
        super().add_request(request)
        if limit is not None and request.num_prompt_tokens >= limit:  # what the frontend refuses, let in (headless)
            self._luce_fail(self.luce_admission.end_beyond_share(request.request_id))

    def schedule(self, *args, **kwargs):
        rows = {}
        if self.luce_admission is not None:
            if getattr(self, "_luce_host_starved", False):
                self._luce_make_host_room()
            if self.waiting and self.luce_admission.config.gpu_cold and getattr(self, "_luce_short_of_blocks", False):
                rows = self._luce_take_back()
        output = super().schedule(*args, **kwargs)
        if rows:
            from vllm_luce import hooks

            hooks.bind("vllm.v1.core.sched.output:SchedulerOutput.luce_cold_rows", output, rows)
        # Requests left waiting with sequences and tokens to spare waited for blocks: the next step may take lent
        # blocks back for them (waiting for a sequence or the token budget, they would gain nothing by it)
        self._luce_short_of_blocks = bool(self.waiting) and len(self.running) < self.max_num_running_reqs and \
            output.total_num_scheduled_tokens < self.max_num_scheduled_tokens
        if self.luce_admission is not None:
            from vllm_luce.kvflash.engine_tiers import report

            admission = self.luce_admission
            # Requests wait for host memory that only this engine's own requests hold, and none of those ran: none
            # will finish to give it back, so the next step makes room (``_luce_make_host_room``)
            self._luce_host_starved = bool(admission.held_back) and not any(
                admission.reserved.get(req_id) for req_id in output.num_scheduled_tokens)
            report(admission, self._luce_tier_labels)
            self._luce_fail(admission.take_expired(time.monotonic()))
        return output

    def _luce_take_back(self) -> dict[str, int]:
        """While requests wait, free blocks below ``reserve_blocks`` come back from blocks lent for cold chunks, the
        newest running request's first (the one vLLM would preempt first), each holder's host reservation raised first
        for the chunks that then go to host memory (a holder without room keeps its blocks). Its workers move the
        chunks out before the blocks change hands; returns the rows cut: request -> its row's length in blocks."""
        manager, admission, rows = getattr(self, "luce_kvflash_manager", None), self.luce_admission, {}
        short = 0 if manager is None else admission.config.reserve_blocks - manager.block_pool.get_num_free_blocks()
        if short <= 0:
            return rows
        lookahead = getattr(self, "num_lookahead_tokens", 0) or 0
        for request in reversed(self.running):
            req_id = request.request_id
            count = min(manager.luce_lent_blocks(req_id), short)
            if count <= 0:
                continue
            # the tokens its workers may hold: the step in flight's and rejected drafts' too
            tokens = request.num_computed_tokens + getattr(request, "num_output_placeholders", 0) + lookahead
            held = len(manager.req_to_blocks[req_id])
            nbytes = admission.config.host_bytes(admission.tokens_for(req_id, tokens), held - count)
            if admission.take(req_id, nbytes, count):
                rows[req_id] = manager.luce_take_back(req_id, count)
                short -= count
            if short <= 0:
                break
        return rows

    def _luce_fail(self, expired: list[tuple[str, str]]) -> None:
        """Requests that waited for host memory too long (``kvflash.host_wait_s``), or asked for more than their share
        (``kvflash.host_request_bytes``), end with an error at this step's outputs (the row of vLLM's error set)."""
        from vllm_luce.log import logger, tag

        for req_id, why in expired:
            setting = "host_wait_s" if why == "wait" else "host_request_bytes"
            message = (f"KVFlash could not get host memory for this request's paged-out KV within "
                       f"luce.kvflash.host_wait_s ({self.luce_admission.config.wait_s:g} s)" if why == "wait" else
                       "this request's paged-out KV would need more host memory than its share of "
                       f"luce.kvflash.host_request_bytes ({self.luce_admission.share_of(req_id)} bytes)")
            logger.warning("%s: request %s ends with an error: %s (raise luce.kvflash.%s or host_bytes)", tag(),
                           req_id, message, setting)
            errors = self.grammar_compile_error_reqs
            if isinstance(errors, dict):  # vLLM hands each error's message to the client (RequestError)
                from vllm.outputs import RequestError

                errors[req_id] = RequestError(code="kvflash_host_memory", message=message, retryable=why == "wait")
            else:
                errors.add(req_id)

    def _luce_make_host_room(self) -> None:
        """Preempt the running request that vLLM would preempt first among those holding host memory, when another
        waits for it: the one holding the memory alone is left waiting for other servers to give theirs back."""
        admission = self.luce_admission
        holders = [r for r in self.running if admission.reserved.get(r.request_id)]
        if not holders:
            return
        victim = max(holders, key=lambda r: (r.priority, r.arrival_time)) if self.policy.name == "PRIORITY" \
            else holders[-1]
        if not admission.waiting_besides(victim.request_id):
            return
        self.running.remove(victim)
        self._preempt_request(victim, time.monotonic())

    def update_from_output(self, scheduler_output, model_runner_output):
        result = super().update_from_output(scheduler_output, model_runner_output)
        if self.luce_admission is not None:
            from vllm_luce.kvflash.engine_tiers import report

            report(self.luce_admission, self._luce_tier_labels, step_end=False)
            if self.luce_admission.shares:
                self.luce_admission.keep_shares(self.requests)
        return result

    def shutdown(self) -> None:
        if self.luce_admission is not None:
            for req_id in list(self.luce_admission.reserved):
                self.luce_admission.release(req_id)
        super().shutdown()

    def _mamba_block_aligned_split(self, request, num_new_tokens: int, num_new_local_computed_tokens: int = 0,
                                   num_external_computed_tokens: int = 0) -> int:
        if self._luce_vllm_aligns:
            num_new_tokens = super()._mamba_block_aligned_split(
                request, num_new_tokens, num_new_local_computed_tokens, num_external_computed_tokens)
        if self._luce_pool_tokens is None:
            return num_new_tokens
        start = request.num_computed_tokens + num_new_local_computed_tokens + num_external_computed_tokens
        cfg = self._luce_pager
        plan = Decisions(cfg.chunk_tokens, cfg.pool_tokens, cfg.epoch_tokens, cfg.tau_min, request.num_prompt_tokens)
        # asynchronous scheduling: the step in flight's tokens (its drafts too) count as computed until its output
        num_new_tokens = plan.cut(start, num_new_tokens, behind=request.num_output_placeholders)
        manager, admission = getattr(self, "luce_kvflash_manager", None), self.luce_admission
        if not num_new_tokens or manager is None:
            return num_new_tokens
        admission.room[request.request_id] = plan.room_until(start, start + num_new_tokens)
        if start:  # a running request (prefix caching is off): its step's host memory, before vLLM allocates
            end = min(start + num_new_tokens + (getattr(self, "num_lookahead_tokens", 0) or 0),
                      self.vllm_config.model_config.max_model_len)
            nbytes = manager.luce_step_host_bytes(request.request_id, admission.tokens_for(request.request_id, end))
            if not admission.hold(request.request_id, nbytes):
                return 0  # it waits for host memory this step; vLLM skips it and preempts nobody for it
        return num_new_tokens


class LuceKVFlashScheduler(KVFlashSchedulerMixin, Scheduler):
    pass


class LuceKVFlashAsyncScheduler(KVFlashSchedulerMixin, AsyncScheduler):
    pass
