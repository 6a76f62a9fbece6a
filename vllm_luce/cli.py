"""`vllm-luce` command line.

    vllm-luce info                                    versions, executors, configuration keys
    vllm-luce check MODEL [--additional-config JSON]  a configuration validated and resolved, vLLM not started
    vllm-luce convert-drafter DRAFTER_DIR OUT.gguf    a z-lab DFlash drafter as a Lucebox GGUF

Both info and check exit 1 with the message `vllm serve` would stop with (naming the variable, flag or key and
what is accepted) when a VLLM_LUCE_* variable or a setting is wrong; docs/cli.md.
"""

from __future__ import annotations

import argparse
import sys


def info() -> int:
    from vllm_luce.version import __version__
    from vllm_luce.compat import is_supported, supported_range
    from vllm_luce.config import AVAILABLE_FEATURES, ENV_PREFIX, SCHEMA
    from vllm_luce.dry_run import check_environment, installed_vllm_version
    from vllm_luce.architectures import EXECUTORS, executors_mode

    try:
        check_environment()
    except ValueError as e:  # LuceConfigError, or a bad VLLM_LUCE_EXECUTORS
        print(f"vllm-luce info: {e}", file=sys.stderr)
        return 1
    version = installed_vllm_version()
    vllm_line = (f"vLLM {version} ({'supported' if is_supported(version) else 'UNSUPPORTED'})" if version
                 else "vLLM not installed")
    print(f"vllm-luce {__version__}; {vllm_line}; supported vLLM {supported_range()}")
    print(f"executors: {executors_mode()} ({len(EXECUTORS)} architectures)")
    for arch, path in EXECUTORS.items():
        print(f"  {arch} -> {path.rsplit(':', 1)[1]}")
    print('configuration: --additional-config \'{"luce": {SECTION: {KEY: VALUE}}}\' or '
          f"{ENV_PREFIX}<SECTION>_<KEY>")
    for section, keys in SCHEMA.items():
        state = "available" if section in AVAILABLE_FEATURES else "not yet available"
        print(f"  {section} ({state})")
        for key, spec in keys.items():
            print(f"    {key} = {spec.default!r}  ({spec.accepted})")
    return 0


def check(args: argparse.Namespace) -> int:
    from vllm_luce.dry_run import CHECK_ERRORS, check as check_configuration

    try:
        lines = check_configuration(args.model, args.additional_config, args.max_model_len,
                                    args.tensor_parallel_size, args.speculative_model, args.spec_tokens)
    except CHECK_ERRORS as e:
        print(f"vllm-luce check: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"got {value!r}; expected an integer >= 1")
    return number


def convert_drafter(src: str, out: str, linear_type: str) -> int:
    import time
    from pathlib import Path

    from vllm_luce.spec_decode.gguf_drafter import DrafterFormatError, write_gguf

    weights = sum(f.stat().st_size for f in Path(src).glob("*.safetensors"))
    print(f"converting {src} ({weights / 2**30:.2f} GiB of safetensors) to {out} with {linear_type} linears",
          flush=True)
    started = time.perf_counter()
    try:
        info = write_gguf(src, out, linear_type)
    except (DrafterFormatError, OSError, KeyError) as e:
        print(f"vllm-luce convert-drafter: {src}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}: {info['architecture']}, {info['layers']} layers, hidden {info['hidden']}, "
          f"{info['tensors']} tensors, linears {linear_type}, block {info['block_size']}, "
          f"target layers {info['target_layer_ids']}; in {time.perf_counter() - started:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    from vllm_luce.patches.engine_args import additional_config_json
    from vllm_luce.spec_decode.gguf_drafter import LINEAR_TYPES

    parser = argparse.ArgumentParser(prog="vllm-luce", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, executors and configuration keys")
    chk = sub.add_parser("check", help="validate a configuration and print every resolved value, without starting "
                                       "vLLM (reads the model's config.json only)")
    chk.add_argument("model", metavar="MODEL", help="the model directory or downloaded model id vllm serve gets")
    chk.add_argument("--additional-config", type=additional_config_json, default=None, metavar="JSON",
                     help='vLLM\'s flag: \'{"luce": {SECTION: {KEY: VALUE}}}\' (VLLM_LUCE_* variables apply too)')
    chk.add_argument("--max-model-len", type=positive_int, default=None, metavar="N",
                     help="vLLM's flag (default: config.json's max_position_embeddings)")
    chk.add_argument("--tensor-parallel-size", "-tp", type=positive_int, default=1, metavar="N", help="vLLM's flag")
    chk.add_argument("--speculative-model", "--spec-model", dest="speculative_model", default=None,
                     metavar="dflash|PATH",
                     help="dflash (find the target's DFlash drafter) or a drafter path or id")
    chk.add_argument("--spec-tokens", "--num-speculative-tokens", dest="spec_tokens", type=positive_int, metavar="N",
                     default=None, help="draft tokens per step (default: the drafter's block size - 1)")
    conv = sub.add_parser("convert-drafter", help="write a z-lab DFlash drafter (safetensors) as a GGUF file")
    conv.add_argument("drafter_dir", help="directory with config.json and *.safetensors")
    conv.add_argument("out", help="GGUF file to write")
    conv.add_argument("--linear-type", choices=LINEAR_TYPES, default="bf16",
                      help="storage of projection weights (norms stay F32); bf16 is lossless for bf16 drafters")
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    if args.command == "check":
        return check(args)
    if args.command == "convert-drafter":
        return convert_drafter(args.drafter_dir, args.out, args.linear_type)
    return 2


if __name__ == "__main__":
    sys.exit(main())
