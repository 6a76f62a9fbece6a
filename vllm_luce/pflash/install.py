"""Switch PFlash on in a VllmConfig: every check that needs no weights runs here, in the process
that parses the configuration, so a missing, truncated or incompatible drafter stops startup."""

from __future__ import annotations

from typing import Any

from vllm_luce.checkpoint_headers import DrafterError
from vllm_luce.config import Installed, LuceConfig, LuceConfigError
from vllm_luce.pflash.drafter_spec import DrafterSpec, has_tokenizer


def install_pflash(vllm_config: Any, luce: LuceConfig) -> Installed | None:
    pf = luce.pflash
    if not pf.enabled:
        return None
    if not pf.drafter:
        raise LuceConfigError("luce.pflash.drafter: required; expected a path to a Hugging Face causal LM "
                              "directory (config.json + safetensors), e.g. Qwen3-0.6B")
    try:
        spec = DrafterSpec.load(pf.drafter)
    except DrafterError as e:
        raise LuceConfigError(str(e)) from None
    if pf.early_exit_layers > spec.num_layers:
        raise LuceConfigError(f"luce.pflash.early_exit_layers: got {pf.early_exit_layers}; the drafter "
                              f"{spec.path} has {spec.num_layers} layers")
    model_config = getattr(vllm_config, "model_config", None)
    target_vocab = model_config.get_vocab_size() if model_config is not None else None
    if has_tokenizer(spec):
        mode = "its own tokenizer (mapped through text when the target's differs)"
    elif target_vocab is not None and spec.vocab_size < target_vocab:
        raise LuceConfigError(
            f"luce.pflash.drafter: {spec.path} has no tokenizer and a vocabulary of {spec.vocab_size} tokens, "
            f"smaller than the target's {target_vocab}; add the drafter's tokenizer files or use a drafter "
            "sharing the target's tokenizer")
    else:
        mode = "the target's tokenizer"
    _install_worker_extension(vllm_config)
    return Installed(f"drafter {spec.path.name} ({spec.architecture}, {spec.num_layers} layers, "
                     f"{pf.early_exit_layers or spec.num_layers} scored) with {mode}; keep {pf.keep_ratio}, "
                     f"prompts >= {pf.min_prompt_tokens} tokens")


def _install_worker_extension(vllm_config: Any) -> None:
    """The engine client reaches the scorer through vLLM's worker extension class."""
    from vllm_luce.pflash.worker import EXTENSION

    parallel = getattr(vllm_config, "parallel_config", None)
    if parallel is None:
        return
    current = parallel.worker_extension_cls
    if current and current != EXTENSION:
        raise LuceConfigError(f"luce.pflash: needs --worker-extension-cls {EXTENSION}, but it is set to "
                              f"{current!r}; PFlash cannot share the worker extension with another class")
    from vllm_luce import hooks, overrides

    overrides.warn(overrides.WORKER_EXTENSION, current, EXTENSION)
    hooks.bind("vllm.config.parallel:ParallelConfig.worker_extension_cls", parallel, EXTENSION)
