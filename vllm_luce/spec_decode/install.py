"""Switch the DFlash gate on in a VllmConfig: point vLLM's ``scheduler_cls`` setting at the gated scheduler
(``hooks.GATED_SCHEDULERS``) when vLLM speculates with DFlash, and on Model Runner V2 on CUDA give vLLM the
draft-length table that makes it capture one-token decode graphs (``plain_steps_v2.py``). Called from the VllmConfig
patch."""

from __future__ import annotations

from typing import Any

from vllm_luce import hooks
from vllm_luce.config import Installed, LuceConfig, LuceConfigError
from vllm_luce.hooks import GATED_SCHEDULERS, KVFLASH_SCHEDULERS, SCHEDULER_CLS, VLLM_DEFAULT_SCHEDULERS


def install_gate(vllm_config: Any, luce: LuceConfig) -> Installed | None:
    """The scheduler class installed (the summary), or None when the gate does not apply (with the reason logged
    by the caller through ``gate_status``)."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or spec.method != "dflash":
        return None
    dflash = luce.dflash
    if not (dflash.on_when_used() and dflash.gate):
        return None
    from vllm_luce.spec_decode.plain_steps_v2 import graph_table, set_graph_table

    table = getattr(spec, "num_speculative_tokens_per_batch_size", None)
    if table and table != graph_table(spec.num_speculative_tokens, vllm_config.scheduler_config.max_num_seqs):
        raise LuceConfigError(
            "speculative_config.num_speculative_tokens_per_batch_size: vllm-luce's DFlash gate measures and "
            "chooses the draft length per step; remove the table or set --additional-config "
            '\'{"luce": {"dflash": {"gate": false}}}\'')
    sched = vllm_config.scheduler_config
    current = sched.scheduler_cls
    if current in GATED_SCHEDULERS.values():
        return Installed(current)
    if current not in VLLM_DEFAULT_SCHEDULERS and current not in KVFLASH_SCHEDULERS.values():
        raise LuceConfigError(
            f"--scheduler-cls {current}: vllm-luce's DFlash gate needs its own scheduler class; drop "
            "--scheduler-cls or set --additional-config '{\"luce\": {\"dflash\": {\"gate\": false}}}'")
    from vllm_luce import overrides

    installed = GATED_SCHEDULERS[bool(getattr(sched, "async_scheduling", False))]
    if current in VLLM_DEFAULT_SCHEDULERS:  # a KVFlash class here was set by vllm-luce (a copied config)
        overrides.warn(overrides.GATE_SCHEDULER, current, installed)
    hooks.bind(SCHEDULER_CLS, sched, installed)
    set_graph_table(vllm_config)  # Model Runner V2 on CUDA: one-token decode graphs for plain steps
    return Installed(sched.scheduler_cls)
