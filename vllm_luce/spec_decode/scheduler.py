"""Binds the DFlash gate (``gate.py``) to vLLM's scheduler through its own hooks.

vLLM's scheduler asks ``self.dynamic_sd_lookup[batch_size]`` each step for how many tokens to draft (its
static dynamic-speculation table) and sends the answer to the model runner as
``SchedulerOutput.num_spec_tokens_to_schedule``. Both model runners honour it: V1 (and the CPU runner built
on it) and Model Runner V2, synchronous or asynchronous scheduling. The gate stands in for that table, and
this scheduler mixin, in the classes installed with vLLM's ``scheduler_cls`` setting (``vllm_luce/schedulers.py``,
with KVFlash's mixin), feeds it what each step cost and committed. With K = 0 the drafter writes only its context,
so its KV stays complete (``patches/dflash_proposer_v1.py`` on V1, ``plain_steps_v2.py`` on V2), and the next
step verifies nothing.

The gate decides before vLLM schedules the step, for the running and the admissible waiting requests, so
that drafts no one may use are dropped first: all of them on a plain step (so it verifies nothing), and
those of a request the gate stopped or that declined speculation on every step.
"""

from __future__ import annotations

import time

from vllm_luce import hooks, metrics, request_args
from vllm_luce.log import logger, tag
from vllm_luce.spec_decode.gate import SpecGate
from vllm_luce.spec_decode.gate_report import GateReport


class GatedLookup:
    """What vLLM indexes as ``dynamic_sd_lookup[batch_size]``: the K the scheduler ``plan``ned for the step.
    Asked without a plan (a test's own scheduling), it decides for the batch vLLM scheduled."""

    def __init__(self, scheduler: "DFlashGateMixin"):
        self.scheduler = scheduler
        self.planned: int | None = None

    def plan(self) -> int:
        s = self.scheduler
        self.planned = self.decide(min(len(s.running) + len(s.waiting), s.max_num_running_reqs))
        return self.planned

    def decide(self, batch_size: int) -> int:
        self.scheduler._luce_batch = batch_size  # the regime the step's outcome is observed in
        return self.scheduler.luce_max_spec_tokens if self.scheduler.luce_gate.decide(batch_size, self.drafting) else 0

    def drafting(self) -> bool:
        """Whether a request may use drafts made this step: a running one the gate lets draft, or a waiting one a
        free sequence slot may admit (vLLM's DFlash drafts for a prompt whose prefill ends in the step)."""
        s, may = self.scheduler, self.scheduler.luce_gate.request_may_draft
        return (any(may(r.request_id) for r in s.running)
                or len(s.running) < s.max_num_running_reqs and any(may(r.request_id) for r in s.waiting))

    def __getitem__(self, batch_size: int) -> int:
        k, self.planned = self.planned, None
        return self.decide(batch_size) if k is None else k


def carries_prompt_tokens(output) -> bool:
    """Whether a scheduled step computes more than one token for some request beyond its drafts: a prompt
    (chunk), a resumed request or a new one. Such steps are not samples: their cost is mostly the prompt's."""
    drafts = output.scheduled_spec_decode_tokens
    verified = sum(map(len, drafts.values())) if drafts else 0
    return bool(output.scheduled_new_reqs) or output.total_num_scheduled_tokens - verified > len(
        output.num_scheduled_tokens)


class DFlashGateMixin:
    """Scheduler mixin: the batch gate (K per step), the per-request draft stop and opt-out; their metrics in
    ``gate_report.py``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.luce_gate = SpecGate()
        self.luce_max_spec_tokens = self.num_spec_tokens
        hooks.bind("vllm.v1.core.sched.scheduler:Scheduler.dynamic_sd_lookup", self, GatedLookup(self))
        self._luce_batch = 0  # the batch size of the latest decision
        self._luce_planned: int | None = None  # the K of the latest step the gate planned
        self._luce_scheduled_at: dict[int, tuple] = {}  # a step's output -> its start, batch, whether measured
        self._luce_last_update = 0.0
        self.luce_report = GateReport({"model_name": metrics.model_name(self.vllm_config)})
        logger.info("%s: DFlash gate on (up to %d draft tokens per step)", tag(), self.luce_max_spec_tokens)

    def add_request(self, request) -> None:
        if request_args.declined(request.sampling_params, request_args.DFLASH):
            self.luce_gate.decline(request.request_id)
        super().add_request(request)

    def schedule(self, *args, **kwargs):
        start, gate, lookup = time.perf_counter(), self.luce_gate, self.dynamic_sd_lookup
        k = lookup.plan() if isinstance(lookup, GatedLookup) and (self.running or self.waiting) else None
        stale = self._luce_planned == 0  # drafts made by a plain step are stale: V2 skips the drafter there
        if k == 0 or stale or gate.holds_back:
            for request in self.running:
                if request.spec_token_ids and (k == 0 or stale or not gate.request_may_draft(request.request_id)):
                    hooks.bind("vllm.v1.request:Request.spec_token_ids", request, [])  # verify nothing this step
        if k is not None:
            self._luce_planned = k
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            if isinstance(lookup, GatedLookup):
                lookup.planned = None  # vLLM asks for the plan only when it scheduled a request
        at = self._luce_scheduled_at
        at[id(output)] = (start, self._luce_batch, k is not None and not carries_prompt_tokens(output))
        while len(at) > 8:  # an output that never reaches update_from_output must not pile up
            del at[next(iter(at))]
        return output

    def update_from_output(self, scheduler_output, model_runner_output):
        started, batch, measured = self._luce_scheduled_at.pop(id(scheduler_output), (None, 0, False))
        if started is not None:
            self._luce_observe(scheduler_output, model_runner_output, started, batch, measured)
        result = super().update_from_output(scheduler_output, model_runner_output)
        self._luce_last_update = time.perf_counter()
        gate = self.luce_gate
        for req_id in [r for r in (*gate.requests, *gate.declined) if r not in self.requests]:
            gate.forget(req_id)  # finished or aborted
        if self.luce_report.due(draining=not self.requests):
            self.luce_report.publish(gate)
        return result

    def _luce_observe(self, scheduler_output, model_runner_output, started: float, batch: int,
                      measured: bool) -> None:
        """Each verified request's acceptance into the gate; the step itself when it is a sample: decided by the
        gate, no prompt tokens, and it verified and drafted in the same mode (not a transition)."""
        sampled, index = model_runner_output.sampled_token_ids, model_runner_output.req_id_to_index
        spec = scheduler_output.scheduled_spec_decode_tokens
        if not scheduler_output.num_scheduled_tokens or not sampled:
            return
        rejected = 0
        for req_id, drafts in spec.items():
            i = index.get(req_id)
            if i is not None and i < len(sampled) and drafts:
                accepted = max(0, len(sampled[i]) - 1)
                rejected += len(drafts) - accepted
                self.luce_gate.observe_request(req_id, accepted, batch)
                self.luce_report.verify(len(drafts), accepted)
        speculative = bool(spec)
        if measured and speculative == (scheduler_output.num_spec_tokens_to_schedule > 0):
            seconds = time.perf_counter() - max(started, self._luce_last_update)
            self.luce_gate.observe(speculative=speculative, batch_size=batch, seconds=seconds,
                                   committed_tokens=scheduler_output.total_num_scheduled_tokens - rejected)

