"""KVFlash's scheduler hook: a pooled prompt's last token gets a step of its own (``prompt_end.py``).

vLLM's scheduler clips each request's chunk in ``_mamba_block_aligned_split`` (0.26 through 0.33, the same
signature; see LEDGER), called only when ``need_mamba_block_aligned_split`` is set (Mamba prefix caching in
"align" mode, which KVFlash never runs with: it turns prefix caching off). The mixin sets the flag, runs
vLLM's alignment where vLLM wanted it, then applies ``split_prompt_end``. Without paged KVFlash it does
nothing. It is part of every vllm-luce scheduler class (the DFlash gate's included).
"""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_luce.kvflash.prompt_end import split_prompt_end

TARGET = "vllm.v1.core.sched.scheduler:Scheduler._mamba_block_aligned_split"


def pooled_prompt_tokens(vllm_config) -> int | None:
    """The pool size in tokens when paged KVFlash is on, else None."""
    from vllm_luce.config import LuceConfig
    from vllm_luce.kvflash.settings import pager_config_from

    kv = LuceConfig.from_vllm_config(vllm_config).kvflash
    if not kv.enabled or kv.selection != "page":
        return None
    return pager_config_from(kv).pool_tokens


class KVFlashSchedulerMixin:
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._luce_pool_tokens = pooled_prompt_tokens(self.vllm_config)
        self._luce_vllm_aligns = self.need_mamba_block_aligned_split
        if self._luce_pool_tokens is not None:
            from vllm_luce.patches import check_signature, ledger_signature

            check_signature(TARGET, Scheduler._mamba_block_aligned_split, ledger_signature(TARGET))
            from vllm_luce import hooks

            hooks.bind("vllm.v1.core.sched.scheduler:Scheduler.need_mamba_block_aligned_split", self, True)

    def _mamba_block_aligned_split(self, request, num_new_tokens: int, num_new_local_computed_tokens: int = 0,
                                   num_external_computed_tokens: int = 0) -> int:
        if self._luce_vllm_aligns:
            num_new_tokens = super()._mamba_block_aligned_split(
                request, num_new_tokens, num_new_local_computed_tokens, num_external_computed_tokens)
        if self._luce_pool_tokens is None:
            return num_new_tokens
        start = request.num_computed_tokens + num_new_local_computed_tokens + num_external_computed_tokens
        return split_prompt_end(start, num_new_tokens, request.num_tokens, request.num_prompt_tokens,
                                self._luce_pool_tokens)


class LuceKVFlashScheduler(KVFlashSchedulerMixin, Scheduler):
    pass


class LuceKVFlashAsyncScheduler(KVFlashSchedulerMixin, AsyncScheduler):
    pass
