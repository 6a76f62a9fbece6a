"""`vllm-luce` command line.

    vllm-luce info                                    versions, executors, configuration keys
    vllm-luce convert-drafter DRAFTER_DIR OUT.gguf    a z-lab DFlash drafter as a Lucebox GGUF
"""

from __future__ import annotations

import argparse
import sys


def info() -> int:
    from vllm_luce import __version__
    from vllm_luce.compat import is_supported, supported_range
    from vllm_luce.config import AVAILABLE_FEATURES, ENV_PREFIX, SCHEMA
    from vllm_luce.model_executor.registry import EXECUTORS, executors_mode

    try:
        import vllm
        vllm_line = f"vLLM {vllm.__version__} ({'supported' if is_supported(vllm.__version__) else 'UNSUPPORTED'})"
    except ImportError:
        vllm_line = "vLLM not installed"
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


def convert_drafter(src: str, out: str, linear_type: str) -> int:
    from vllm_luce.spec_decode.gguf_drafter import DrafterFormatError, write_gguf

    try:
        info = write_gguf(src, out, linear_type)
    except (DrafterFormatError, OSError, KeyError) as e:
        print(f"vllm-luce convert-drafter: {src}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}: {info['architecture']}, {info['layers']} layers, hidden {info['hidden']}, "
          f"{info['tensors']} tensors, linears {linear_type}, block {info['block_size']}, "
          f"target layers {info['target_layer_ids']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from vllm_luce.spec_decode.gguf_drafter import LINEAR_TYPES

    parser = argparse.ArgumentParser(prog="vllm-luce", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, executors and configuration keys")
    conv = sub.add_parser("convert-drafter", help="write a z-lab DFlash drafter (safetensors) as a GGUF file")
    conv.add_argument("drafter_dir", help="directory with config.json and *.safetensors")
    conv.add_argument("out", help="GGUF file to write")
    conv.add_argument("--linear-type", choices=LINEAR_TYPES, default="bf16",
                      help="storage of projection weights (norms stay F32); bf16 is lossless for bf16 drafters")
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    if args.command == "convert-drafter":
        return convert_drafter(args.drafter_dir, args.out, args.linear_type)
    return 2


if __name__ == "__main__":
    sys.exit(main())
