"""Snapshot every vLLM name vllm-luce relies on in each supported vLLM release, from its PyPI wheel.

    python scripts/vllm_signatures.py            # every supported version (downloads the wheels once)
    python scripts/vllm_signatures.py 0.26.0     # one version

Writes tests/patches/vllm_signatures/<version>.json: {name: what the release has there}, for every patch target of
the ledger, every name a row of vllm_luce/hooks.py checks and every vLLM module vllm_luce imports: a function's
signature, "class", "attribute", "module", or null where the release lacks it (``source_signatures.in_tree``). tests/patches/test_ledger_versions.py checks the
ledger and the hook table against every version the README claims. A wheel is downloaded into $VLLM_LUCE_WHEELS
(default /tmp/vllm-wheels), its Python sources extracted there (vllm-<version>-src/) and the wheel deleted; nothing
is imported or installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vllm_luce.compat import SNAPSHOT_RELEASES  # noqa: E402
from vllm_luce import source_signatures  # noqa: E402
from vllm_luce.hook_ledger import LEDGER  # noqa: E402
from vllm_luce.hooks import HOOKS  # noqa: E402

OUT = ROOT / "tests" / "patches" / "vllm_signatures"


def names() -> list[str]:
    """Every name a snapshot records: the ledger's targets, every row's checks and the vLLM modules vllm_luce
    imports."""
    imported = source_signatures.imported_vllm_modules(ROOT / "vllm_luce").values()
    checked = {e.target for e in LEDGER} | {name for hook in HOOKS for name in hook.checks}
    return sorted(checked | set().union(*imported))


def sources(version: str, cache: Path) -> Path:
    """The release's Python sources (the wheel's vllm/*.py), extracted once."""
    tree = cache / f"vllm-{version}-src"
    if (tree / "vllm").is_dir():
        return tree
    found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64",
                        "-d", str(cache), f"vllm=={version}"], check=True)
        found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    with zipfile.ZipFile(found[0]) as whl:
        whl.extractall(tree, [n for n in whl.namelist() if n.startswith("vllm/") and n.endswith(".py")])
    found[0].unlink()  # hundreds of MB; the sources are all a snapshot reads
    return tree


def snapshot(version: str, cache: Path) -> dict[str, str | None]:
    tree = sources(version, cache)
    return {name: source_signatures.in_tree(tree, name) for name in names()}


def main(argv: list[str]) -> None:
    cache = Path(os.environ.get("VLLM_LUCE_WHEELS", "/tmp/vllm-wheels"))
    cache.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    for version in argv or SNAPSHOT_RELEASES:
        found = snapshot(version, cache)
        (OUT / f"{version}.json").write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        missing = sorted(t for t, s in found.items() if s is None)
        print(f"{version}: {len(found) - len(missing)} names found, {len(missing)} absent {missing}")


if __name__ == "__main__":
    main(sys.argv[1:])
