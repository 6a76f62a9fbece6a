"""Patch: `--speculative-model dflash` and drafter resolution when vLLM builds SpeculativeConfig
(see LEDGER). The logic lives in `vllm_luce.spec_decode.resolve`; this file only binds it."""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from vllm_luce import hooks, overrides
from vllm_luce.log import logger, tag
from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_method
from vllm_luce.spec_decode import resolve as R

TARGETS = "vllm.engine.arg_utils:EngineArgs"
FLAG_HELP = ("vllm-luce: the speculative drafter. `dflash` finds the DFlash drafter of the target "
             "(TARGET/dflash/, a sibling <target-name>-DFlash*, $VLLM_LUCE_DRAFTER, then z-lab's name in the "
             "Hugging Face cache); a path or repository id is used as given. Same as --spec-model; "
             "method and --spec-tokens default from the drafter (block size - 1).")


ADDITIONAL_CONFIG_EXAMPLE = '\'{"luce": {"kvflash": {"pool_tokens": 4096}}}\''


def additional_config_json(value: str) -> dict:
    """`--additional-config` as a JSON object. vLLM's own type passes text that does not look like
    one ('{"luce": {' cut short) through as a string, which fails later as a pydantic traceback."""
    if value in ("", "None"):  # vLLM's spelling of "unset"
        return {}
    try:
        parsed = json.loads(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}) in {value!r}; expected a JSON object such as "
                                         f"{ADDITIONAL_CONFIG_EXAMPLE}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"got {value!r}; expected a JSON object such as {ADDITIONAL_CONFIG_EXAMPLE}")
    return parsed


def _make_add_cli_args(original):
    @functools.wraps(original)
    def add_cli_args(parser):
        parser = original(parser)
        if not any("--speculative-model" in a.option_strings for a in parser._actions):
            parser.add_argument("--speculative-model", dest="spec_model", default=None, help=FLAG_HELP)
        for action in parser._actions:
            if "--additional-config" in action.option_strings:
                hooks.bind("argparse:Action.type (vLLM's --additional-config)", action, additional_config_json)
        return parser

    return add_cli_args


def apply_dflash_defaults(engine_args, target: str, target_text_config: dict) -> R.ResolvedDrafter | None:
    """Resolve `dflash`, fill unset method and token count, check the drafter; None if not DFlash."""
    spec = dict(engine_args.speculative_config or {})
    from_flag = engine_args.spec_model is not None
    model = engine_args.spec_model if from_flag else spec.get("model")
    method = engine_args.spec_method or spec.get("method")
    if model is None or method not in (None, "dflash"):
        if model == R.DFLASH_WORD:
            raise R.DrafterMismatch(f"--speculative-model dflash resolves a DFlash drafter, but the "
                                    f"speculative method is {method!r}; leave it unset or use 'dflash'")
        return None
    resolved = R.resolve_drafter(model, target)
    if resolved.path.endswith(".gguf"):
        if not Path(resolved.path).is_file():
            raise R.DrafterNotFound(f"--speculative-model {resolved.path}: no such GGUF file")
        from vllm_luce.spec_decode.gguf_drafter import materialize

        resolved = R.ResolvedDrafter(str(materialize(resolved.path)), f"{resolved.source}, GGUF {resolved.path}")
    drafter_config = R.load_drafter_config(resolved.path)
    is_dflash = method == "dflash" or (drafter_config is not None and R.DFLASH_ARCHITECTURE in
                                       (drafter_config.get("architectures") or []))
    if not is_dflash:
        return None

    def set_default(flag_attr: str, key: str, value) -> None:
        if getattr(engine_args, flag_attr) is None and key not in spec:
            if from_flag:
                hooks.bind(f"vllm.engine.arg_utils:EngineArgs.{flag_attr}", engine_args, value)
            else:
                spec[key] = value

    if from_flag:
        hooks.bind("vllm.engine.arg_utils:EngineArgs.spec_model", engine_args, resolved.path)
    else:
        spec["model"] = resolved.path
    set_default("spec_method", "method", "dflash")
    if drafter_config is not None:
        block_tokens = R.default_num_speculative_tokens(drafter_config, resolved.path)
        set_default("spec_tokens", "num_speculative_tokens", block_tokens)
        R.check_drafter_matches_target(drafter_config, target_text_config, resolved.path, target)
        R.check_drafter_weights(resolved.path, "--speculative-model" if from_flag else "--speculative-config model")
    if not from_flag:
        hooks.bind("vllm.engine.arg_utils:EngineArgs.speculative_config", engine_args, spec)
    fit_draft_slots(engine_args, engine_args.spec_tokens if from_flag else spec.get("num_speculative_tokens"))
    return resolved


def fit_draft_slots(engine_args, num_speculative_tokens: int | None) -> tuple[int, int] | None:
    """DFlash drafts a block in parallel: vLLM reserves ``K - 1`` token slots per running request inside the
    step's token budget and stops startup when ``max_num_batched_tokens - (K - 1) * max_num_seqs`` is not
    positive, as vLLM's serve defaults on H100/H200 (8192 tokens, 1024 requests) are at K = 15. Where the
    user left --max-num-seqs unset and vLLM's defaults would not fit, it becomes the largest power of two
    whose slots take at most half of the budget. Returns (max_num_seqs, slots per request) when it sets it."""
    if engine_args.max_num_seqs is not None or not num_speculative_tokens or num_speculative_tokens < 2:
        return None
    slots = num_speculative_tokens - 1
    world = engine_args.tensor_parallel_size * engine_args.pipeline_parallel_size
    batched_defaults, seqs_defaults = engine_args.get_batch_defaults(world)
    budgets = {context: engine_args.max_num_batched_tokens or batched for context, batched in batched_defaults.items()}
    short = {c: seqs for c, seqs in seqs_defaults.items() if c in budgets and budgets[c] - slots * seqs <= 0}
    if not short:  # the defaults fit in every usage context (offline LLM, vllm serve)
        return None
    seqs = 1 << max(0, (min(budgets[c] for c in short) // (2 * slots)).bit_length() - 1)
    overrides.warn(overrides.DRAFT_SLOTS, max(short.values()), seqs, overrides.VLLM_DEFAULT)
    hooks.bind("vllm.engine.arg_utils:EngineArgs.max_num_seqs", engine_args, seqs)
    return engine_args.max_num_seqs, slots


def _make_create_speculative_config(original):
    @functools.wraps(original)
    def create_speculative_config(self, target_model_config, target_parallel_config):
        resolved = apply_dflash_defaults(self, target_model_config.model,
                                         target_model_config.hf_text_config.to_dict())
        if resolved is not None:
            logger.info("%s: DFlash drafter %s (%s)", tag(), resolved.path, resolved.source)
        return original(self, target_model_config, target_parallel_config)

    return create_speculative_config


def apply() -> bool:
    from vllm.engine.arg_utils import EngineArgs

    a = wrap_method(EngineArgs, "add_cli_args", ledger_signature(f"{TARGETS}.add_cli_args"), _make_add_cli_args)
    b = wrap_method(EngineArgs, "create_speculative_config",
                    ledger_signature(f"{TARGETS}.create_speculative_config"), _make_create_speculative_config)
    return a or b
