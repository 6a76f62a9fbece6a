"""Shared test setup: vLLM's CPU environment and the tiny model fixtures (built once per session)."""

import logging
import os
from pathlib import Path

import pytest

from fixtures.server import CPU_ENV

# Set before vLLM is imported anywhere.
# In-process engines (one process, ready in seconds); `vllm serve` tests set their own.
for _name, _value in {**CPU_ENV, "TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
    os.environ.setdefault(_name, _value)

# Families served by Luce executors, and what their tiny fixtures look like to the layer plan.
EXECUTOR_FAMILIES = {
    "qwen3_6": ("LuceQwen3_5ForCausalLM", "4 layers: 1 full_attention, 3 linear_attention"),
    "qwen3_6_moe": ("LuceQwen3_5MoeForCausalLM", "4 layers: 1 full_attention, 3 linear_attention"),
    "gemma4": ("LuceGemma4ForCausalLM", "4 layers: 1 full_attention, 3 sliding_attention"),
    "laguna": ("LuceLagunaForCausalLM", "4 layers: 1 full_attention, 3 sliding_attention"),
}


@pytest.fixture(scope="session")
def fixtures_root(tmp_path_factory) -> Path:
    """Where tiny checkpoints live: $LUCE_TEST_FIXTURES (reused across runs) or a session tmp dir."""
    root = os.environ.get("LUCE_TEST_FIXTURES")
    return Path(root) if root else tmp_path_factory.mktemp("fixtures")


@pytest.fixture(scope="session")
def tiny_model(fixtures_root):
    from fixtures.tiny_models import build_model

    def get(family: str) -> Path:
        return build_model(family, fixtures_root / family)

    return get


@pytest.fixture(scope="session")
def tiny_drafter(fixtures_root, tiny_model):
    """A random DFlash drafter in z-lab's layout for a tiny target family."""
    from fixtures.tiny_models import build_dflash_drafter

    def get(family: str) -> Path:
        return build_dflash_drafter(tiny_model(family), fixtures_root / f"{family}-dflash")

    return get


@pytest.fixture
def luce_log(caplog):
    """caplog holding vllm-luce's lines, each once: its logger is vLLM's child, and once vLLM has set up logging, its
    logger does not propagate to the root logger that caplog listens on; before that, it does."""
    logger = logging.getLogger("vllm.luce")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.setLevel(level)
    logger.propagate = propagate
