"""Binds the DFlash gate (``gate.py``) to vLLM's scheduler through its own hooks.

vLLM's scheduler asks ``self.dynamic_sd_lookup[batch_size]`` each step for how many tokens to
draft (its static dynamic-speculation table) and sends the answer to the model runner as
``SchedulerOutput.num_spec_tokens_to_schedule``. Both model runners honour it: V1
(``gpu_model_runner.py``, and the CPU runner built on it) and Model Runner V2
(``worker/gpu/model_runner.py``); with 0 the DFlash proposer still runs its context pass, so the
drafter's KV stays complete, and returns no drafts. The gate therefore stands in for that
table, and this scheduler subclass, installed with vLLM's ``scheduler_cls`` setting, feeds it
what each step cost and committed. Nothing in the workers changes.

The gate decides before vLLM schedules the step, not when vLLM asks (after scheduling): with DFlash,
vLLM's scheduler sets aside K draft slots of the step's token budget for every request it schedules
(the drafter's mask queries must fit its input buffers), whether K turns out 0 or not. A step the gate
runs plain is scheduled without that reservation (``PlainStepConfig``). Measured on CPU (trained
Qwen3.6 pair, the load test's budget of 320 tokens, 32 sequences): with the reservation, plain steps
scheduled 9.5 requests on average against 15.5 in an engine without speculation. Such a step also
drops the drafts of the step before unless speculation wins its regime (``SpecGate.keeps_drafts``).
"""

from __future__ import annotations

import time
from operator import attrgetter

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_luce import metrics, request_args
from vllm_luce.kvflash.scheduler import KVFlashSchedulerMixin
from vllm_luce.log import logger, tag
from vllm_luce.spec_decode.gate import GateConfig, SpecGate

LOG_EVERY_S = 10.0
REPORT_EVERY_S = 0.25  # gate metrics while requests run; always when the engine drains
RATES_EVERY_S = 1.0
COMPUTED_TOKENS = attrgetter("num_computed_tokens")
# Drafts made in a step are verified in the next, after this step's own token: with fewer tokens left, the
# verify step may commit one token at most, so the drafts cannot be used (the tail of a batch of requests that
# reach max_tokens together: one verify step of 13 requests cost 0.7 s on CPU, trained pair).
MIN_TOKENS_LEFT_TO_DRAFT = 3


class GatedLookup:
    """What vLLM indexes as ``dynamic_sd_lookup[batch_size]``: the gate's K for the step. The scheduler
    ``plan``s it before scheduling; vLLM's lookup then returns that plan. Asked without one (a test's own
    scheduling), it decides for the batch vLLM scheduled."""

    def __init__(self, scheduler: "DFlashGateMixin"):
        self.scheduler = scheduler
        self.planned: int | None = None

    def plan(self) -> int:
        """K for the step about to be scheduled: its batch is the running requests and the waiting ones
        that fit in the sequence slots, and it carries prompt tokens if a request waits or one has more
        than its newest token to compute."""
        s = self.scheduler
        batch = min(len(s.running) + len(s.waiting), s.max_num_running_reqs)
        self.planned = self.decide(batch, s.luce_prompt_pending())
        return self.planned

    def decide(self, batch_size: int, prompt: bool) -> int:
        s = self.scheduler
        s._luce_regime = (batch_size, s.luce_mean_context(), prompt)  # observed with the step's outcome
        speculate = s.luce_gate.decide(*s._luce_regime[:2], self.drafting, prompt)
        return s.luce_max_spec_tokens if speculate else 0

    def drafting(self) -> bool:
        """Whether a request may use drafts made this step: a running one that the gate lets draft, with at least
        ``MIN_TOKENS_LEFT_TO_DRAFT`` tokens left before ``max_tokens``, or a waiting one that a free sequence slot
        may admit (a prompt whose prefill ends in this step is drafted for, as by vLLM's own DFlash). Asked only
        when the gate would speculate."""
        s, gate = self.scheduler, self.scheduler.luce_gate

        def may_use(r) -> bool:
            return r.max_tokens - r.num_output_tokens >= MIN_TOKENS_LEFT_TO_DRAFT and gate.request_may_draft(r.request_id)

        return any(map(may_use, s.running)) or len(s.running) < s.max_num_running_reqs and any(map(may_use, s.waiting))

    def __getitem__(self, batch_size: int) -> int:
        k, self.planned = self.planned, None
        return self.decide(batch_size, self.scheduler.luce_prompt_pending()) if k is None else k


class PlainStepConfig:
    """The ``vllm_config`` that vLLM's ``Scheduler.schedule`` reads on a step the gate runs plain: the same,
    except that its speculative config reserves no draft slots (``max_num_new_slots_for_drafting`` 0). The
    step drafts nothing, so the drafter needs none; with them, a budget of 320 tokens fits 20 requests at
    K = 15. Every other attribute is the real config's."""

    def __init__(self, config):
        self._config = config
        self.speculative_config = _NoDraftSlots(config.speculative_config)

    def __getattr__(self, name: str):
        return getattr(self._config, name)


class _NoDraftSlots:
    max_num_new_slots_for_drafting = 0

    def __init__(self, spec):
        self._spec = spec

    def __getattr__(self, name: str):
        return getattr(self._spec, name)


def carries_prompt_tokens(output) -> bool:
    """Whether a scheduled step computes more than one token for some request beyond its drafts: a prompt
    (chunk), a resumed request or a new one. A decode row computes its newest token and its drafts."""
    drafts = output.scheduled_spec_decode_tokens
    verified = sum(map(len, drafts.values())) if drafts else 0
    return bool(output.scheduled_new_reqs) or output.total_num_scheduled_tokens - verified > len(
        output.num_scheduled_tokens)


def schedule_reads_draft_slots(scheduler_cls) -> bool:
    """Whether vLLM's ``schedule`` reads the draft reservation from ``self.vllm_config.speculative_config``,
    where ``PlainStepConfig`` answers it (vLLM 0.32)."""
    import inspect

    source = inspect.getsource(scheduler_cls.schedule)
    return "self.vllm_config.speculative_config" in source and ".max_num_new_slots_for_drafting" in source


def gate_config(scheduler) -> GateConfig:
    """The gate's settings for this scheduler. Probes compare a probe's drafts with the tokens each request commits
    after them; an asynchronous scheduler (Model Runner V2's default) schedules a step before the previous one's
    tokens are in, so there every re-check stays an exploration run."""
    return GateConfig(probes=not isinstance(scheduler, AsyncScheduler))


class DFlashGateMixin:
    """Scheduler mixin: the batch gate (K per step) and the per-request draft stop."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.luce_gate = SpecGate(gate_config(self))
        self.luce_max_spec_tokens = self.num_spec_tokens
        self.dynamic_sd_lookup = GatedLookup(self)
        self._luce_scheduled_at: dict[int, tuple] = {}  # a step's output -> its start and regime
        self._luce_regime: tuple | None = None  # batch, mean context and prompt flag of the latest decision
        self._luce_plain_config = None
        # Whether the step scheduled last drafts (K > 0); the engine core asks the workers for drafts only then
        # (patches/engine_core_post_step.py).
        self.luce_step_drafts = True
        self._luce_drafts_held = True  # whether a running request may hold drafts: cleared when all are dropped
        self._luce_prompt_rows = True  # whether the step scheduled last carried prompt tokens (see luce_prompt_pending)
        self._luce_probe: tuple | None = None  # batch and context of the probe scheduled last (its drafts to compare)
        self._luce_watch: dict[str, list] = {}  # a probe's requests -> [first output index, drafts, matched, settled]
        self._luce_watch_regime: tuple = ()
        self._luce_lean = 0  # steps left that run plain without the gate deciding or observing (plain_steps_ahead)
        self._luce_lean_batch = 0  # the running requests they were counted for
        if schedule_reads_draft_slots(Scheduler):
            self._luce_plain_config = PlainStepConfig(self.vllm_config)
        else:
            logger.warning("%s: vLLM's Scheduler.schedule no longer reads its draft-slot reservation where "
                           "vllm-luce expects it; plain steps keep it (fewer requests per step)", tag())
        self._luce_last_update = 0.0
        self._luce_last_log = time.monotonic()
        self._luce_labels = {"model_name": metrics.model_name(self.vllm_config)}
        self._luce_reported_at = 0.0
        self._luce_rates_at = 0.0
        self._luce_verified = 0  # drafts sent to verification since the last report
        self._luce_accepted_counts: dict[int, int] = {}  # accepted drafts -> verify steps, since the last report
        logger.info("%s: DFlash gate on (up to %d draft tokens per step)", tag(), self.luce_max_spec_tokens)

    def luce_mean_context(self) -> int:
        running = self.running
        return sum(map(COMPUTED_TOKENS, running)) // len(running) if running else 0

    def luce_prompt_pending(self) -> bool:
        """Whether the step about to be scheduled will likely carry prompt tokens: a request waits, or a
        running one has more than its newest token left to compute (a prompt in chunks, or a request resumed
        after preemption). Read before scheduling (``GatedLookup.plan``). Only a step that carried prompt tokens
        leaves a running request more than one token to compute (a request enters the running ones from the
        waiting ones), so after a step without any the running requests are not scanned: at batch 64 on CPU
        the scan took about 20 us of the plan's 37 us a step."""
        return bool(self.waiting) or self._luce_prompt_rows and any(
            r.num_tokens - r.num_computed_tokens > 1 for r in self.running)

    def add_request(self, request) -> None:
        if request_args.declined(request.sampling_params, request_args.DFLASH):
            self.luce_gate.decline(request.request_id)
        super().add_request(request)

    def schedule(self, *args, **kwargs):
        if self._luce_lean and not self.waiting and not self._luce_prompt_rows and len(
                self.running) == self._luce_lean_batch:
            return self._luce_schedule_lean(*args, **kwargs)
        gate = self.luce_gate
        start = time.perf_counter()
        lookup = self.dynamic_sd_lookup
        self._luce_regime = None
        planned = lookup.plan() if isinstance(lookup, GatedLookup) and (self.running or self.waiting) else None
        self._luce_lean = 0
        if planned == 0 and not self.waiting and not self._luce_watch:  # the gate rules out prompt steps itself
            self._luce_lean, self._luce_lean_batch = gate.plain_steps_ahead(), len(self.running)
        probe, self._luce_probe = self._luce_probe, None
        if self._luce_drafts_held:  # a step drafted since the running requests' drafts were last dropped
            drop_all = planned == 0 and not gate.keeps_drafts()  # a plain step where speculation does not pay
            if drop_all and probe is not None:
                self._luce_watch_probe(probe)
            if drop_all or gate.holds_back:  # else only a request stopped or declining drafts loses them
                for request in self.running:
                    if request.spec_token_ids and (drop_all or not gate.request_may_draft(request.request_id)):
                        request.spec_token_ids = []  # verify nothing for it this step
            self._luce_drafts_held = not drop_all
        output = self._luce_vllm_schedule(planned == 0, *args, **kwargs)
        self.luce_step_drafts = output.num_spec_tokens_to_schedule > 0
        if gate.probing and self.luce_step_drafts:
            self._luce_probe = self._luce_regime[:2]
        self._luce_drafts_held |= self.luce_step_drafts
        self._luce_prompt_rows = carries_prompt_tokens(output)
        at = self._luce_scheduled_at
        at[id(output)] = (start, self._luce_regime)
        while len(at) > 8:  # an output that never reaches update_from_output must not pile up
            del at[next(iter(at))]
        return output

    def _luce_schedule_lean(self, *args, **kwargs):
        """A step of ``SpecGate.plain_steps_ahead``: plain and without the draft reservation, counted by the gate but
        neither decided nor observed (not in ``_luce_scheduled_at``). Such a step follows a plain one in the same
        regime, so no request holds drafts."""
        self._luce_lean -= 1
        self.luce_gate.skip_plain_step()
        self.dynamic_sd_lookup.planned = 0  # what vLLM's lookup answers
        output = self._luce_vllm_schedule(True, *args, **kwargs)
        self.luce_step_drafts = False
        self._luce_prompt_rows = carries_prompt_tokens(output)
        return output

    def _luce_vllm_schedule(self, plain: bool, *args, **kwargs):
        """vLLM's ``schedule``; a ``plain`` step without the draft reservation (``PlainStepConfig``). The lookup's plan
        is spent afterwards (vLLM asks for it only when it scheduled a request)."""
        lookup, config = self.dynamic_sd_lookup, self.vllm_config
        if plain and self._luce_plain_config is not None:
            self.vllm_config = self._luce_plain_config
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.vllm_config = config
            if isinstance(lookup, GatedLookup):
                lookup.planned = None

    def update_from_output(self, scheduler_output, model_runner_output):
        started, regime = self._luce_scheduled_at.pop(id(scheduler_output), (None, None))
        self._luce_observe(scheduler_output, model_runner_output, started, regime)
        result = super().update_from_output(scheduler_output, model_runner_output)
        if self._luce_watch:
            self._luce_check_probe()
        self._luce_last_update = time.perf_counter()
        self._luce_release_finished()
        if not self.requests or time.monotonic() - self._luce_reported_at >= REPORT_EVERY_S:
            self._luce_report()
        return result

    def _luce_observe(self, scheduler_output, model_runner_output, started: float | None,
                      regime: tuple | None) -> None:
        """One finished step into the gate, in the regime its mode was decided for (batch, context, prompt)."""
        if started is None or regime is None:  # a step no decision was made for (a lean one, a test's own lookup)
            return
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        scheduled = scheduler_output.num_scheduled_tokens
        spec = scheduler_output.scheduled_spec_decode_tokens
        if not scheduled or not sampled:
            return
        batch, context, prompt = regime
        total = scheduler_output.total_num_scheduled_tokens
        rejected = 0
        for req_id, drafts in spec.items():
            i = index.get(req_id)
            if i is not None and i < len(sampled) and drafts:
                accepted = max(0, len(sampled[i]) - 1)
                rejected += len(drafts) - accepted
                self.luce_gate.observe_request(req_id, accepted, batch, context, prompt)
                self._luce_count_verify(len(drafts), accepted)
        # A clean sample verifies and drafts in the same mode.
        verified = bool(spec)
        drafted = scheduler_output.num_spec_tokens_to_schedule > 0
        if verified == drafted:
            now = time.perf_counter()
            seconds = now - max(started, self._luce_last_update)
            # Scheduled tokens less rejected drafts: a decode row's 1 + accepted, a prompt chunk's tokens.
            self.luce_gate.observe(speculative=verified, batch_size=batch, context_tokens=context,
                                   committed_tokens=total - rejected, seconds=seconds, prompt=prompt)

    def _luce_watch_probe(self, regime: tuple) -> None:
        """Before a probe's drafts are dropped: each running request's drafts, to compare with the tokens it commits
        from its next one on (the drafts follow the token sampled in the probe step). A probe still unsettled (a
        request that went on matching) is settled with what it matched so far."""
        if self._luce_watch:
            self._luce_settle_probe()
        self._luce_watch = {r.request_id: [r.num_output_tokens, list(r.spec_token_ids), 0, False]
                            for r in self.running if r.spec_token_ids}
        self._luce_watch_regime = regime

    def _luce_check_probe(self) -> None:
        """The watched drafts against the tokens committed since: a request is settled at its first draft that differs,
        when all its drafts matched, or when it is gone (finished or aborted: speculation could not have committed
        more either). Once all are settled, the gate gets the mean matched drafts per request."""
        for req_id, entry in self._luce_watch.items():
            start, drafts, matched, settled = entry
            if settled:
                continue
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                entry[3] = True
                continue
            out = request.output_token_ids
            available = min(len(out) - start, len(drafts))
            while matched < available and out[start + matched] == drafts[matched]:
                matched += 1
            entry[2], entry[3] = matched, matched < available or matched == len(drafts)
        if all(entry[3] for entry in self._luce_watch.values()):
            self._luce_settle_probe()

    def _luce_settle_probe(self) -> None:
        watch, self._luce_watch = self._luce_watch, {}
        self.luce_gate.observe_probe(*self._luce_watch_regime, sum(e[2] for e in watch.values()) / len(watch))

    def _luce_count_verify(self, verified: int, accepted: int) -> None:
        """Tallied here, published with the report: per-request metric writes cost 3 ms a step at batch 64
        with 15 drafts each (one write per accepted position)."""
        self._luce_verified += verified
        self._luce_accepted_counts[accepted] = self._luce_accepted_counts.get(accepted, 0) + 1

    def _luce_publish_verify(self) -> None:
        labels, counts = self._luce_labels, self._luce_accepted_counts
        if not counts:
            return
        metrics.inc("dflash_drafts", sum(counts.values()), **labels)
        metrics.inc("dflash_verified_tokens", self._luce_verified, **labels)
        metrics.inc("dflash_accepted_tokens", sum(a * n for a, n in counts.items()), **labels)
        for position in range(max(counts)):  # drafts accepted at a position: the steps that accepted more
            metrics.inc("dflash_accepted_tokens_per_pos", sum(n for a, n in counts.items() if a > position),
                        position=position, **labels)
        self._luce_verified, self._luce_accepted_counts = 0, {}

    def _luce_report(self) -> None:
        """Gate state into ``vllm:luce_dflash_*`` (per-regime rates at most once a second), and into the log every
        ``LOG_EVERY_S`` (here, not with a step's observation: lean steps are not observed). Profiled on CPU,
        reporting every step cost 0.09 ms of a 5 ms step."""
        gate, labels = self.luce_gate, self._luce_labels
        now = self._luce_reported_at = time.monotonic()
        if now - self._luce_last_log >= LOG_EVERY_S:
            self._luce_last_log = now
            logger.info("%s: %s", tag(), gate.summary())
        self._luce_publish_verify()
        for mode, steps in gate.decisions.items():
            metrics.set_total("dflash_gate_steps", steps, mode=mode, **labels)
        metrics.set_total("dflash_gate_explorations", gate.explorations, **labels)
        metrics.set_total("dflash_gate_probes", gate.probes, **labels)
        metrics.set_gauge("dflash_gate_speculating", float(gate.speculating), **labels)
        metrics.set_gauge("dflash_requests_not_drafting", gate.stopped_requests(), **labels)
        if time.monotonic() - self._luce_rates_at < RATES_EVERY_S:
            return
        self._luce_rates_at = time.monotonic()
        metrics.remove_gauges("dflash_gate_rate_tokens_per_second")
        metrics.remove_gauges("dflash_gate_speedup")
        for (b, c, p), r in sorted(gate.regimes.items()):
            regime = {"batch_le": b, "context_le_k": c, "with_prompt": str(p).lower()}
            for mode, rate in (("spec", r.spec_rate), ("plain", r.plain_rate)):
                if rate.samples:
                    metrics.set_gauge("dflash_gate_rate_tokens_per_second", rate.value, mode=mode, **regime, **labels)
            speedup = r.speedup()
            if speedup is not None:
                metrics.set_gauge("dflash_gate_speedup", speedup, **regime, **labels)

    def _luce_release_finished(self) -> None:
        gate = self.luce_gate
        if not (gate.requests or gate.declined):  # only these requests have gate state
            return
        for req_id in [r for r in (*gate.requests, *gate.declined) if r not in self.requests]:
            gate.forget(req_id)


class LuceGatedScheduler(KVFlashSchedulerMixin, DFlashGateMixin, Scheduler):
    pass


class LuceGatedAsyncScheduler(KVFlashSchedulerMixin, DFlashGateMixin, AsyncScheduler):
    pass
