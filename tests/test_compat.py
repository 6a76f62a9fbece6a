import os
import re
import sys
import tomllib
from pathlib import Path

import pytest

from vllm_luce import compat

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("version, supported", [
    ("0.26.0", True), ("0.26.1", True), ("0.32.0+cpu", True), ("0.32.3", True), ("0.33.0", True),
    ("0.33.1rc2.dev5+g1234", True), ("0.34.0", True), ("0.34.2", True), ("0.25.1", False), ("0.27.0", False),
    ("0.31.9", False), ("0.35.0", False), ("1.0.0", False),
])
def test_supported_range(version, supported):
    assert compat.is_supported(version) is supported


def test_unsupported_version_raises_with_the_override_named():
    with pytest.raises(compat.UnsupportedVllmVersion, match="VLLM_LUCE_SKIP_VERSION_CHECK=1"):
        compat.check_vllm_version("0.31.0", {})
    warning = compat.check_vllm_version("0.31.0", {"VLLM_LUCE_SKIP_VERSION_CHECK": "1"})
    assert "vLLM 0.31.0 is installed" in warning
    assert compat.check_vllm_version("0.32.0", {}) is None
    with pytest.raises(compat.UnsupportedVllmVersion, match="cannot read"):
        compat.parse_version("dev")


def test_pyproject_extra_readme_and_reference_agree_with_the_supported_range():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["vllm"] == [f"vllm{compat.supported_range()}"]
    assert not any(dep.startswith("vllm") for dep in pyproject["project"]["dependencies"])
    reference = (ROOT / "docs" / "reference.md").read_text()  # its table is generated (tests/test_docs.py)
    assert f"`vllm{compat.supported_range()}`" in reference
    assert all(re.search(rf"^\| {re.escape(s)}\.x \|", reference, re.M) for s in compat.SUPPORTED_SERIES)
    assert set(compat.RUN_HERE) == set(compat.SUPPORTED_SERIES)
    readme = (ROOT / "README.md").read_text()
    assert f"vLLM {', '.join(s + '.x' for s in compat.SUPPORTED_SERIES[:-1])} and {compat.SUPPORTED_SERIES[-1]}.x" in readme


@pytest.mark.parametrize("version, series", [("0.26.0", "0.26"), ("0.29.1", "0.26"), ("0.32.0+cpu", "0.32"),
                                             ("0.40.0", "0.34"), ("0.20.0", "0.26")])
def test_signature_series_of_a_version(version, series):
    assert compat.signature_series(version) == series


# ------------------------------------------------------------------ on a vLLM vllm-luce does not support
NEWER = "0.35.0"


def test_an_unsupported_vllm_alone_gets_one_warning_and_nothing_else():
    warning = compat.stay_out(NEWER, {"VLLM_LUCE_VENV": "/v", "PATH": "/bin"}, ["vllm", "serve", "/models/m"])
    assert "not the installed vLLM 0.35.0: it stays inactive" in warning and "0.34.x" in warning
    assert compat.stay_out("0.34.0", {}, ["vllm", "serve", "--speculative-model", "dflash"]) is None  # supported
    assert compat.stay_out(NEWER, {"VLLM_LUCE_SKIP_VERSION_CHECK": "1", "VLLM_LUCE_KVFLASH": "1"}, []) is None


@pytest.mark.parametrize("environ, argv, asked", [
    ({"VLLM_LUCE_KVFLASH_POOL_TOKENS": "4096"}, [], "VLLM_LUCE_KVFLASH_POOL_TOKENS"),
    ({"VLLM_LUCE_PFLASH": "1"}, [], "VLLM_LUCE_PFLASH"),
    ({"VLLM_LUCE_EXECUTORS": "auto"}, [], "VLLM_LUCE_EXECUTORS"),
    ({}, ["vllm", "serve", "m", "--speculative-model", "dflash"], "--speculative-model dflash"),
    ({}, ["vllm", "serve", "m", "--spec-model=dflash"], "--spec-model dflash"),
    ({}, ["vllm", "serve", "m", "--speculative-config", '{"model": "dflash", "num_speculative_tokens": 7}'],
     "--speculative-config"),
    ({}, ["vllm", "serve", "m", "--additional-config", '{"luce": {"kvflash": {"pool_tokens": 4096}}}'],
     "--additional-config"),
    ({}, ["vllm", "serve", "m", "--additional-config.luce.kvflash.pool_tokens", "4096"], "--additional-config.luce"),
])
def test_asking_for_a_feature_on_an_unsupported_vllm_stops_naming_the_supported_releases(environ, argv, asked):
    with pytest.raises(compat.UnsupportedVllmVersion) as stopped:
        compat.stay_out(NEWER, environ, argv)
    message = str(stopped.value)
    assert message.startswith(asked) and "supports vLLM 0.26.x, 0.32.x, 0.33.x, 0.34.x" in message
    assert "vLLM 0.35.0 is installed" in message


@pytest.mark.parametrize("environ, argv", [
    ({"VLLM_LUCE_EXECUTORS": "off", "VLLM_LUCE_KVFLASH": "0", "VLLM_LUCE_PFLASH_ENABLED": "false"}, []),
    ({}, ["vllm", "serve", "m", "--spec-model", "/models/drafter", "--speculative-config", '{"method": "dflash"}']),
    ({}, ["vllm", "serve", "m", "--additional-config", '{"luce": {"kvflash": false}, "other": 1}']),
    ({}, ["vllm", "serve", "m", "--additional-config", "{not json"]),
])
def test_what_asks_for_nothing_leaves_vllm_alone(environ, argv):
    assert compat.asked_for(environ, argv) == []
    assert "stays inactive" in compat.stay_out(NEWER, environ, argv)


def test_a_luce_section_asks_unless_it_switches_everything_off():
    assert not compat.asked_in_config(None) and not compat.asked_in_config({"other": 1})
    assert not compat.asked_in_config({"luce": {"pflash": {"enabled": False}}})
    assert compat.asked_in_config({"luce": {"pflash": {"drafter": "/d"}}})
    assert compat.asked_in_config({"luce": {"kvflsh": {}}})  # a typo is still meant for vllm-luce


@pytest.fixture
def unregistered(monkeypatch):
    """vllm_luce.register() as in a fresh process, on a vLLM of the version the test sets, recording what it
    registers and patches."""
    import vllm

    import vllm_luce
    from vllm_luce import metrics, patches
    from vllm_luce.model_executor import registry
    from vllm_luce.patches import vllm_config

    calls = []
    monkeypatch.setattr(vllm_luce, "_registered", False)
    for owner, name in ((registry, "register_executors"), (registry, "register_drafters"), (patches, "apply_patches"),
                        (metrics, "install"), (vllm_config, "apply_guard")):
        monkeypatch.setattr(owner, name, lambda *a, _name=name, **k: calls.append(_name) or "")
    for name in [n for n in os.environ if n.startswith("VLLM_LUCE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(sys, "argv", ["vllm", "serve", "/models/m"])

    def register(version):
        monkeypatch.setattr(vllm, "__version__", version)
        vllm_luce.register()
        return calls

    register.calls = calls
    return register


def test_register_on_an_unsupported_vllm_registers_and_patches_nothing_but_the_guard(unregistered, caplog):
    with caplog.at_level("WARNING", logger="vllm.luce"):
        assert unregistered(NEWER) == ["apply_guard"]
        assert unregistered(NEWER) == ["apply_guard"]  # once per process
    assert len([r for r in caplog.records if "stays inactive" in r.getMessage()]) == 1


def test_register_on_a_supported_vllm_or_with_the_override_registers_everything(unregistered, monkeypatch):
    everything = ["register_executors", "register_drafters", "apply_patches", "install"]
    assert unregistered("0.34.0") == everything
    import vllm_luce

    monkeypatch.setattr(vllm_luce, "_registered", False)
    monkeypatch.setenv("VLLM_LUCE_SKIP_VERSION_CHECK", "1")
    assert unregistered(NEWER)[len(everything):] == everything


def test_register_on_an_unsupported_vllm_stops_a_server_that_asks_for_a_feature(unregistered, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["vllm", "serve", "/models/m", "--speculative-model", "dflash"])
    with pytest.raises(compat.UnsupportedVllmVersion, match="--speculative-model dflash asks for vllm-luce"):
        unregistered(NEWER)
    assert unregistered.calls == []
    monkeypatch.setattr(sys, "argv", ["vllm", "serve", "/models/m"])
    monkeypatch.setenv("VLLM_LUCE_KVFLASH_POOL_TOKENS", "4096")
    with pytest.raises(compat.UnsupportedVllmVersion, match="VLLM_LUCE_KVFLASH_POOL_TOKENS asks for vllm-luce"):
        unregistered(NEWER)


def test_the_guard_stops_a_config_with_a_luce_section_and_runs_vllms_code_otherwise(monkeypatch):
    import vllm

    from vllm_luce.patches.vllm_config import apply_guard

    monkeypatch.setattr(vllm, "__version__", NEWER)

    class Config:  # a stand-in for VllmConfig: its own __post_init__ records that it ran
        ran = 0

        def __init__(self, additional_config):
            self.additional_config = additional_config
            self.__post_init__()

        def __post_init__(self):
            type(self).ran += 1

    assert apply_guard(Config) and not apply_guard(Config)  # idempotent
    Config({"other": 1})
    Config({"luce": {"kvflash": {"enabled": False}}})
    assert Config.ran == 2
    with pytest.raises(compat.UnsupportedVllmVersion, match="the `luce` section of additional_config asks"):
        Config({"luce": {"kvflash": {"pool_tokens": 4096}}})
    assert Config.ran == 2
