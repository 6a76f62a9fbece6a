"""Snapshot the signature of every ledger target in each supported vLLM release, from its PyPI wheel.

    python scripts/vllm_signatures.py            # every supported version (downloads the wheels once)
    python scripts/vllm_signatures.py 0.26.0     # one version

Writes tests/patches/vllm_signatures/<version>.json: {target: signature or null where the release lacks
it}, read by tests/patches/test_ledger_versions.py, which checks the ledger against every version the
README claims. Wheels are cached in $VLLM_LUCE_WHEELS (default /tmp/vllm-wheels); only the Python
sources are read, nothing is imported or installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vllm_luce.compat import SNAPSHOT_RELEASES  # noqa: E402
from vllm_luce.patches import signatures  # noqa: E402
from vllm_luce.patches.ledger import LEDGER  # noqa: E402

OUT = ROOT / "tests" / "patches" / "vllm_signatures"


def wheel(version: str, cache: Path) -> Path:
    found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64",
                        "-d", str(cache), f"vllm=={version}"], check=True)
        found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    return found[0]


def snapshot(version: str, cache: Path) -> dict[str, str | None]:
    with tempfile.TemporaryDirectory() as tree, zipfile.ZipFile(wheel(version, cache)) as whl:
        whl.extractall(tree, [n for n in whl.namelist() if n.startswith("vllm/") and n.endswith(".py")])
        return {e.target: signatures.in_tree(Path(tree), e.target) for e in LEDGER}


def main(argv: list[str]) -> None:
    cache = Path(os.environ.get("VLLM_LUCE_WHEELS", "/tmp/vllm-wheels"))
    cache.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    for version in argv or SNAPSHOT_RELEASES:
        found = snapshot(version, cache)
        (OUT / f"{version}.json").write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        missing = sorted(t for t, s in found.items() if s is None)
        print(f"{version}: {len(found) - len(missing)} targets found, {len(missing)} absent {missing}")


if __name__ == "__main__":
    main(sys.argv[1:])
