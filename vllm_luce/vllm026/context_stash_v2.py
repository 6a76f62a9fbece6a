"""vLLM 0.26, Model Runner V2: the DFlash gate's plain steps hold the drafter's context inputs and write them in one
pass later (``dflash.plain_context_stash``; what is held and how: ``context_stash.py``).

On vLLM 0.26 V2's DFlash speculator writes the drafter's context eagerly on every step, a plain one too (the plain
steps' binding, ``spec_decode/plain_steps_v2.py``, skips only the drafter's forward); held and written in one pass,
the context costs a plain step much less beyond vLLM alone (docs/benchmarks.md, "DFlash: output tokens/s by
concurrency"). From vLLM 0.32 the drafter's CUDA graph writes a decode step's context and the stash does not apply:
``auto`` is 0 there and a number stops startup.

Rows of vllm_luce/hooks.py that reach this module, each removed with vLLM 0.26: ``check_setting`` after vLLM's
config checks (after the gate's install), ``bind_v2`` after V2's ``initialize_kv_cache`` (after the plain steps'
binding), and the drafter's two instance wraps that ``bind_context_stash`` sets.
"""

from __future__ import annotations

from typing import Any

from vllm_luce import hooks
from vllm_luce.config import LuceConfigError
from vllm_luce.log import logger, tag
from vllm_luce.spec_decode.plain_steps_v2 import v2_on_cuda
from vllm_luce.vllm026.context_stash import ContextStash

AUTO_CONTEXT_STASH = 1024  # tokens, 40 MB at Qwen3-8B-DFlash's shape (docs/dflash.md, "Limits")


def context_stash_tokens(setting: int | str, vllm_config: Any) -> int:
    """``dflash.plain_context_stash`` resolved: ``auto`` is ``AUTO_CONTEXT_STASH`` where the stash applies and 0
    elsewhere; a number where it does not apply is refused. It applies to Model Runner V2 on CUDA with vLLM 0.26,
    whose DFlash speculator writes the drafter's context eagerly (from 0.32 the drafter's CUDA graph writes a
    decode step's context)."""
    if not setting:
        return 0
    from vllm_luce.compat import installed_series

    if not v2_on_cuda(vllm_config):
        where = "Model Runner V2 on CUDA"
    elif (series := installed_series()) != "0.26":
        where = f"vLLM 0.26 (this is vLLM {series})"
    else:
        return AUTO_CONTEXT_STASH if setting == "auto" else setting
    if setting == "auto":
        return 0
    raise LuceConfigError(f"dflash.plain_context_stash={setting}: applies to {where}; set it to 0 or leave it out")


def check_setting(vllm_config: Any, luce) -> None:
    """After vLLM's checks, where the DFlash gate is installed (``spec_decode/install.py``): a number of tokens where
    the stash cannot apply stops startup."""
    spec, dflash = getattr(vllm_config, "speculative_config", None), luce.dflash
    if spec is not None and spec.method == "dflash" and dflash.on_when_used() and dflash.gate:
        context_stash_tokens(dflash.plain_context_stash, vllm_config)


class StashableStep:
    """Whether the step the runner is executing may stash its context, noted before vLLM's ``execute_model``: a plain
    step of one token per request in which no request started, finished or was preempted, so no cache block changed
    hands since the step before."""

    def __init__(self):
        self.stashable = False

    def note(self, scheduler_output) -> None:
        out = scheduler_output
        self.stashable = getattr(out, "num_spec_tokens_to_schedule", None) == 0 and not out.scheduled_new_reqs \
            and not out.finished_req_ids and not out.preempted_req_ids \
            and out.total_num_scheduled_tokens == len(out.num_scheduled_tokens)


def bind_v2(runner, luce) -> ContextStash | None:
    """After V2's ``initialize_kv_cache`` and the plain steps' binding (``plain_steps_v2.bind_v2``, the row before):
    the stash, where ``dflash.plain_context_stash`` comes to a number of tokens (a number was checked at startup;
    auto resolves the same way here)."""
    step = getattr(runner, "luce_plain_steps", None)
    if step is None:
        return None
    setting = luce.dflash.plain_context_stash
    tokens = setting if isinstance(setting, int) else context_stash_tokens(setting, runner.vllm_config)
    if not tokens:
        return None
    stash, stashable = ContextStash(tokens), StashableStep()
    write_held = bind_context_stash(runner.speculator, stash, stashable)

    def before_step(scheduler_output) -> None:
        stashable.note(scheduler_output)
        if getattr(scheduler_output, "kv_cache_block_copies", None):
            write_held()  # the step first copies cache blocks (a partial prefix hit): complete them

    step.stash, step.before_step = stash, before_step
    logger.info("%s: DFlash (Model Runner V2, vLLM 0.26): plain steps stash up to %d tokens of the drafter's context",
                tag(), tokens)
    return stash


def bind_context_stash(speculator, stash: ContextStash, step: StashableStep):
    """A stashable step's context features, positions and slots go to ``stash`` instead of the drafter's cache; any
    other context write first writes what the stash holds (``context_stash.py``). Returns the function that writes
    it."""
    model = speculator.model
    combine, precompute = model.combine_hidden_states, model.precompute_and_store_context_kv
    hidden_size = speculator.hidden_states.shape[-1]

    def combine_or_stage(hidden_states):
        if step.stashable and stash.stage(hidden_states):
            return hidden_states[:, :hidden_size]  # propose copies it into a buffer that no plain step reads
        return combine(hidden_states)

    def precompute_or_commit(context_states, context_positions, context_slot_mapping=None):
        slots = context_slot_mapping
        if stash.staged and slots is not None and not (isinstance(slots, list) and any(s is None for s in slots)):
            return stash.commit(context_positions, slots)
        if stash.staged:  # staged, but this write cannot be kept: compute the features it replaced
            context_states = combine(stash.staged_features())[:context_states.shape[0]]
            stash.unstage()
        if slots is not None:  # a dummy run's pass writes nothing: what the stash holds stays
            write_held()
        return precompute(context_states, context_positions, context_slot_mapping)

    def write_held():
        held = stash.drain()
        if held is not None:
            features, positions, slots = held
            precompute(combine(features), positions, slots)

    hooks.bind("vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.combine_hidden_states", model,
               combine_or_stage)
    hooks.bind("vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.precompute_and_store_context_kv",
               model, precompute_or_commit)
    return write_held
