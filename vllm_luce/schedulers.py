"""The seam where DFlash and KVFlash meet in vLLM's scheduler: the gated scheduler classes, vLLM's schedulers with
KVFlash's mixin (``kvflash/scheduler.py``) ahead of the DFlash gate's (``spec_decode/scheduler.py``).

``hooks.GATED_SCHEDULERS`` names them for vLLM's ``scheduler_cls`` setting, which the gate's install sets; vLLM
imports this module by that path, and no module of vllm-luce imports it. KVFlash's classes without the gate stay
in ``kvflash/scheduler.py``.
"""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_luce.kvflash.scheduler import KVFlashSchedulerMixin
from vllm_luce.spec_decode.scheduler import DFlashGateMixin


class LuceGatedScheduler(KVFlashSchedulerMixin, DFlashGateMixin, Scheduler):
    pass


class LuceGatedAsyncScheduler(KVFlashSchedulerMixin, DFlashGateMixin, AsyncScheduler):
    pass
