"""Logging for vllm-luce: a child of vLLM's `vllm` logger, so lines use vLLM's handler and format."""

from __future__ import annotations

import logging
import multiprocessing
import os
import time

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
    from vllm_luce.version import __version__
    return f"vllm-luce {__version__} [{process_role()} pid={os.getpid()}]"


class StartupStep:
    """A startup step that takes seconds, logged twice: before it, what starts, how big it is and, where a rate is
    known, the expected time ("about N s"); after it (``done``), what was done and the time taken."""

    def __init__(self, what: str, size: str, expected_s: float | None = None):
        self.started = time.perf_counter()
        about = "" if expected_s is None else f", about {expected_s:.0f} s"
        logger.info("%s: %s (%s%s)", tag(), what, size, about)

    def done(self, what: str) -> float:
        took = time.perf_counter() - self.started
        logger.info("%s: %s in %.1f s", tag(), what, took)
        return took
