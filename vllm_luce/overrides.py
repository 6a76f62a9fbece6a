"""Where a vllm-luce feature changes a vLLM setting the user could have set, one WARNING at startup says so.

The line names vLLM's flag, the value asked for (the user's, or vLLM's default where the user left it unset: at
these sites vLLM has already filled its default, so the two cannot be told apart), the value vllm-luce sets, the
feature and the luce setting that turns it off or changes it. A value already equal to the one set warns nothing.

``OVERRIDES`` lists every site (each calls ``warn`` next to its ``hooks.bind``), by its row in ``vllm_luce/hooks.py``;
``UNWARNED`` says why the other setting rows warn nothing (``tests/test_overrides.py`` holds every setting row to
one of the two). ``message`` is the rule, pure, and ``warn`` logs it once per process (a VllmConfig built twice in
one process warns once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_luce.log import logger, tag

KVFLASH_OFF = 'turn KVFlash off to keep it: --additional-config \'{"luce": {"kvflash": false}}\''
KVFLASH_STEP = ("a larger luce.kvflash.pool_tokens raises the cap ((pool chunks - sink_chunks - 2) x chunk_tokens); "
                "luce.kvflash.selection 'sfi' or KVFlash off leaves it")
GATE_OFF = 'turn the gate off to keep it: --additional-config \'{"luce": {"dflash": {"gate": false}}}\''
SCHEDULER = "vllm.config.scheduler:SchedulerConfig"
ENGINE_ARGS = "vllm.engine.arg_utils:EngineArgs"


@dataclass(frozen=True)
class Override:
    target: str    # the setting's row in vllm_luce/hooks.py
    flag: str      # vLLM's command-line flag for the setting
    feature: str
    why: str       # why the feature needs the value it sets
    control: str   # the luce setting (or flag) that turns the override off or changes it


PREFIX_CACHING = Override(
    "vllm.config.cache:CacheConfig.enable_prefix_caching", "--enable-prefix-caching", "KVFlash",
    "a pooled request's KV is not a function of its prefix (it depends on what was paged out or, with SFI, "
    "permuted)", KVFLASH_OFF)
STEP_BUDGET = Override(
    f"{SCHEDULER}.max_num_scheduled_tokens", "--max-num-scheduled-tokens", "KVFlash",
    "a step's new tokens of a request must fit its pool beside the sinks; --max-num-batched-tokens (the worker's "
    "buffers) keeps its value", KVFLASH_STEP)
LONG_PREFILL = Override(
    f"{SCHEDULER}.long_prefill_token_threshold", "--long-prefill-token-threshold", "KVFlash",
    "the same cap per request", KVFLASH_STEP)
KVFLASH_SCHEDULER = Override(
    f"{SCHEDULER}.scheduler_cls", "--scheduler-cls", "KVFlash",
    "vllm-luce's scheduler gives a pooled prompt's last token a step of its own", KVFLASH_OFF)
GATE_SCHEDULER = Override(
    f"{SCHEDULER}.scheduler_cls", "--scheduler-cls", "DFlash gate",
    "the gated scheduler chooses each step's draft length by measured throughput", GATE_OFF)
GATE_GRAPH_TABLE = Override(
    "vllm.config.speculative:SpeculativeConfig.num_speculative_tokens_per_batch_size",
    "--speculative-config num_speculative_tokens_per_batch_size", "DFlash gate",
    "draft lengths K and 0 make Model Runner V2 capture one-token decode graphs for the gate's plain steps", GATE_OFF)
DRAFT_SLOTS = Override(
    f"{ENGINE_ARGS}.max_num_seqs", "--max-num-seqs", "DFlash",
    "vLLM reserves K - 1 draft slots per running request in the step's token budget, and its default leaves no "
    "room for them",
    "set --max-num-seqs or --max-num-batched-tokens to choose")
WORKER_EXTENSION = Override(
    "vllm.config.parallel:ParallelConfig.worker_extension_cls", "--worker-extension-cls", "PFlash",
    "the engine client reaches PFlash's scorer on the worker through it",
    'turn PFlash off to keep it: --additional-config \'{"luce": {"pflash": false}}\'')

OVERRIDES = (PREFIX_CACHING, STEP_BUDGET, LONG_PREFILL, KVFLASH_SCHEDULER, GATE_SCHEDULER, GATE_GRAPH_TABLE,
             DRAFT_SLOTS, WORKER_EXTENSION)

# Settings vllm-luce writes that override no choice of the user's at startup.
FILLS_DFLASH = ("fills what the user left unset where vLLM has no value that runs DFlash (`--speculative-model "
                "dflash` resolved; method and token count from the drafter); the startup log names the drafter")
UNWARNED = {
    f"{ENGINE_ARGS}.spec_model": FILLS_DFLASH,
    f"{ENGINE_ARGS}.spec_method": FILLS_DFLASH,
    f"{ENGINE_ARGS}.spec_tokens": FILLS_DFLASH,
    f"{ENGINE_ARGS}.speculative_config": FILLS_DFLASH,
    "vllm.sampling_params:SamplingParams.extra_args": "per request, vllm-luce's own key (a tool or response-format "
                                                      "request is never compressed); no user value changes",
    "vllm.v1.request:Request.max_tokens": "per request: KVFlash stops a request where its context would need more "
                                          "host memory than its share (finish reason length), as at max_model_len",
    "argparse:Namespace.middleware (vLLM's --middleware)": "adds PFlash's usage middleware after the user's own "
                                                           "--middleware values, which all stay",
}

ASKED = "yours or vLLM's default"
VLLM_DEFAULT = "vLLM's default; you left it unset"

_warned: set[str] = set()


def shown(value: Any) -> str:
    if value is None or value == "":
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def message(override: Override, asked: Any, value: Any, source: str = ASKED) -> str | None:
    """The warning for setting ``override``'s flag from ``asked`` (``source`` says whose value that is; an unset
    one is vLLM's default) to ``value``; None when they are equal, so nothing changes."""
    if asked == value:
        return None
    if asked is None or asked == "":
        source = "vLLM's default"
    return (f"{override.feature} overrides {override.flag}: {shown(asked)} ({source}) -> {shown(value)}. "
            f"Why: {override.why}. To change: {override.control}")


def warn(override: Override, asked: Any, value: Any, source: str = ASKED) -> str | None:
    """Log ``message`` as a WARNING, once per process; returns it (None when nothing changes)."""
    text = message(override, asked, value, source)
    if text is not None and text not in _warned:
        _warned.add(text)
        logger.warning("%s: %s", tag(), text)
    return text
