"""The from_cli_args patch: with PFlash on, vLLM's parsed `--middleware` list gets PFlash's usage middleware after the
user's own; with PFlash off, or a bad luce setting, nothing changes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_luce.patches import engine_args_from_cli
from vllm_luce.pflash.usage_report import MIDDLEWARE

PFLASH = json.dumps({"luce": {"pflash": {"drafter": "/models/scorer"}}})


def parsed(*argv: str):
    """vLLM's own `vllm serve` arguments, parsed (EngineArgs looks for the model's directory: this one exists)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(["--model", str(Path(__file__).parent), *argv])


@pytest.fixture(scope="module")
def patched():
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs

    engine_args_from_cli.apply()
    assert engine_args_from_cli.apply() is False  # applied once
    assert isinstance(EngineArgs.__dict__["from_cli_args"], classmethod)
    return AsyncEngineArgs


def test_with_pflash_on_vllm_serve_gets_the_middleware_after_the_users_own(patched):
    args = parsed("--additional-config", PFLASH, "--middleware", "mine.Middleware")
    engine_args = patched.from_cli_args(args)
    assert isinstance(engine_args, patched) and engine_args.additional_config["luce"]["pflash"]
    assert args.middleware == ["mine.Middleware", MIDDLEWARE]
    patched.from_cli_args(args)  # an API server process builds its EngineArgs again from the same arguments
    assert args.middleware == ["mine.Middleware", MIDDLEWARE]


def test_vllms_default_list_is_left_empty(patched):
    args = parsed("--additional-config", PFLASH)
    default = args.middleware
    patched.from_cli_args(args)
    assert args.middleware == [MIDDLEWARE] and default == [] and parsed().middleware == []


@pytest.mark.parametrize("argv", [(), ("--additional-config", json.dumps({"luce": {"kvflash": {"pool_tokens": 4096}}})),
                                  ("--additional-config", json.dumps({"luce": {"pflash": False}}))])
def test_with_pflash_off_nothing_is_added(patched, argv):
    args = parsed(*argv)
    patched.from_cli_args(args)
    assert args.middleware == []


def test_a_bad_luce_setting_or_a_namespace_without_middleware_adds_nothing():
    args = SimpleNamespace(middleware=[])
    assert not engine_args_from_cli.add_usage_middleware(args, {"luce": {"pflash": {"keep_ratio": "lots"}}})
    assert args.middleware == []  # the VllmConfig patch names the setting at startup
    assert not engine_args_from_cli.add_usage_middleware(SimpleNamespace(), json.loads(PFLASH))


def test_the_environment_switches_pflash_on_too(monkeypatch):
    monkeypatch.setenv("VLLM_LUCE_PFLASH_DRAFTER", "/models/scorer")
    args = SimpleNamespace(middleware=[])
    assert engine_args_from_cli.add_usage_middleware(args, None) and args.middleware == [MIDDLEWARE]
