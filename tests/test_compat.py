import re
import tomllib
from pathlib import Path

import pytest

from vllm_luce import compat

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("version, supported", [
    ("0.26.0", True), ("0.26.1", True), ("0.32.0+cpu", True), ("0.32.3", True), ("0.33.0", True),
    ("0.33.1rc2.dev5+g1234", True), ("0.25.1", False), ("0.27.0", False), ("0.31.9", False), ("0.34.0", False),
    ("1.0.0", False),
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


def test_pyproject_extra_and_readme_agree_with_the_supported_range():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["vllm"] == [f"vllm{compat.supported_range()}"]
    assert not any(dep.startswith("vllm") for dep in pyproject["project"]["dependencies"])
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| 0\.1\.\d+ \| (.+?) \|", readme, flags=re.M)
    assert rows and all(all(s in row for s in compat.SUPPORTED_SERIES) for row in rows), rows


@pytest.mark.parametrize("version, series", [("0.26.0", "0.26"), ("0.29.1", "0.26"), ("0.32.0+cpu", "0.32"),
                                             ("0.40.0", "0.33"), ("0.20.0", "0.26")])
def test_signature_series_of_a_version(version, series):
    assert compat.signature_series(version) == series
