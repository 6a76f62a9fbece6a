import re
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

