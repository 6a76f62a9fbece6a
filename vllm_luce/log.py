"""Logging for vllm-luce: a child of vLLM's `vllm` logger, so lines use vLLM's handler and format."""

from __future__ import annotations

import logging
import multiprocessing
import os

logger = logging.getLogger("vllm.luce")


def process_role() -> str:
    """Which vLLM process this is: api-server, engine-core, worker-N, or in-process (one process)."""
    name = multiprocessing.current_process().name
    if name.startswith("EngineCore"):
        return "engine-core"
    if name.startswith("VllmWorker"):
        return "worker-" + name.rsplit("-", 1)[-1]
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0":
        return "in-process"
    return "api-server"


def tag() -> str:
    from vllm_luce import __version__
    return f"vllm-luce {__version__} [{process_role()} pid={os.getpid()}]"
