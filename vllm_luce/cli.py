"""`vllm-luce` command line: `vllm-luce info` prints what is installed and every configuration key."""

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm-luce", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, executors and configuration keys")
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    return 2


if __name__ == "__main__":
    sys.exit(main())
