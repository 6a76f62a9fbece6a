"""Switch KVFlash on in a VllmConfig (called from the VllmConfig patch, in the process that parses
the configuration, so a bad setting stops startup there).

* The pool settings are validated (a KVFlashConfigError names the key and the floor).
* Every step's new tokens of a request must fit in its pool beside the sinks, so the scheduler's
  token budget per step is capped at ``PagerConfig.max_step_tokens``. vLLM's per-request cap
  (``long_prefill_token_threshold``) is not applied to a request alone in the batch, so the step's
  token budget (``max_num_scheduled_tokens``, which the scheduler spends) is capped too. The worker's
  buffers (``max_num_batched_tokens``) keep their size: CUDA graph capture sizes and DFlash's draft slots
  are laid out from it before this runs, and capping it made capture exceed the buffers on the GPU.
* The scheduler class carries KVFlash's hook that gives a pooled prompt's last token a step of its own
  (``kvflash/scheduler.py``): vLLM's own class is replaced by vllm-luce's, the DFlash gate's has it.
* Prefix caching is switched off: a pooled request's KV depends on what it paged out (with SFI, on
  how its chunks were permuted among its blocks), so it is not a function of the prefix, and vLLM's
  hybrid coordinator takes hits from the other groups alone.
"""

from __future__ import annotations

from typing import Any

from vllm_luce import hooks, overrides
from vllm_luce.config import Installed, LuceConfig, LuceConfigError
from vllm_luce.hooks import GATED_SCHEDULERS, KVFLASH_SCHEDULERS, SCHEDULER_CLS, VLLM_DEFAULT_SCHEDULERS
from vllm_luce.kvflash.pager import KVFlashConfigError
from vllm_luce.kvflash.plan import KVFlashPlan, plan_of


def before_vllm_checks(vllm_config: Any, luce: LuceConfig) -> None:
    """Settings vLLM's own VllmConfig checks must see (prefix caching decides Mamba block sizes)."""
    if luce.kvflash.enabled and vllm_config.cache_config.enable_prefix_caching is not False:
        asked = vllm_config.cache_config.enable_prefix_caching  # True, or None: vLLM's default, on
        overrides.warn(overrides.PREFIX_CACHING, True, False, overrides.ASKED if asked else overrides.VLLM_DEFAULT)
        hooks.bind("vllm.config.cache:CacheConfig.enable_prefix_caching", vllm_config.cache_config, False)


def install_kvflash(vllm_config: Any, luce: LuceConfig) -> Installed | None:
    kv = luce.kvflash
    if not kv.enabled:
        return None
    plan = check_kvflash(vllm_config, luce)
    cfg = plan.pager
    if plan.sfi:  # all KV resident and prefill dense: the scheduler and the engine clients are unchanged
        return Installed(f"SFI: decode attends to {cfg.pool_tokens} tokens (chunks of {cfg.chunk_tokens}), policy "
                         f"{plan.policy}", engine_client=False)
    sched = vllm_config.scheduler_config
    step = cfg.max_step_tokens
    _install_scheduler(sched)
    budget = sched.max_num_scheduled_tokens or sched.max_num_batched_tokens
    overrides.warn(overrides.STEP_BUDGET, budget, min(budget, step))
    hooks.bind("vllm.config.scheduler:SchedulerConfig.max_num_scheduled_tokens", sched, min(budget, step))
    if not sched.long_prefill_token_threshold or sched.long_prefill_token_threshold > step:
        overrides.warn(overrides.LONG_PREFILL, sched.long_prefill_token_threshold or "0 (no cap)", step)
        hooks.bind("vllm.config.scheduler:SchedulerConfig.long_prefill_token_threshold", sched, step)
    return Installed(f"pool {cfg.pool_tokens} tokens, chunks of {cfg.chunk_tokens}, policy {plan.policy}, "
                     f"step <= {step} tokens")


def check_kvflash(vllm_config: Any, luce: LuceConfig) -> KVFlashPlan:
    """Every check of the KVFlash settings against the model and speculation, changing nothing (``vllm-luce check``
    runs it too): the scorer's drafter, the architecture, then the plan (``plan.py``: the pool, the policy's
    selection, and in page mode a step's tokens within the pool), which it returns."""
    kv = luce.kvflash
    if kv.policy == "scorer" and not (luce.pflash.enabled and luce.pflash.drafter):
        raise LuceConfigError("luce.kvflash.policy: got 'scorer'; the drafter scorer is PFlash's, so it needs "
                              "luce.pflash with a drafter (e.g. {\"pflash\": {\"drafter\": PATH}}); or use 'qk' or 'lru'")
    check_architecture(vllm_config)
    try:
        return plan_of(luce, vllm_config)
    except KVFlashConfigError as e:
        raise LuceConfigError(str(e)) from None


def check_architecture(vllm_config: Any) -> None:
    """KVFlash attaches to the Luce executors: any other architecture stops startup here, before the weights load."""
    from vllm_luce.architectures import EXECUTORS, EXECUTORS_ENV, executors_mode

    model = getattr(vllm_config, "model_config", None)
    architectures = list(getattr(model, "architectures", None) or [])
    if not architectures:  # nothing to check against (a config without a model, unit tests)
        return
    if executors_mode() == "off":
        raise LuceConfigError(f"luce.kvflash: {EXECUTORS_ENV}=off serves the model with vLLM's own classes, which "
                              "KVFlash cannot attach to; unset it or turn luce.kvflash off")
    if not set(architectures) & set(EXECUTORS):
        raise LuceConfigError(f"luce.kvflash: the model's architecture {', '.join(architectures)} is not served by a "
                              f"vllm-luce executor (KVFlash attaches to {', '.join(EXECUTORS)}); turn luce.kvflash off "
                              "for this model")


def _install_scheduler(sched: Any) -> None:
    current = sched.scheduler_cls
    if current in GATED_SCHEDULERS.values() or current in KVFLASH_SCHEDULERS.values():
        return
    if current not in VLLM_DEFAULT_SCHEDULERS:
        raise LuceConfigError(f"--scheduler-cls {current}: KVFlash needs vllm-luce's scheduler class (it schedules "
                              "a pooled prompt's last token alone); drop --scheduler-cls or turn luce.kvflash off")
    installed = KVFLASH_SCHEDULERS[bool(getattr(sched, "async_scheduling", False))]
    overrides.warn(overrides.KVFLASH_SCHEDULER, current, installed)
    hooks.bind(SCHEDULER_CLS, sched, installed)
