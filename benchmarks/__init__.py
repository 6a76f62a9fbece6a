"""Benchmarks and the fixture-training scripts (results recorded in docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path


def report(results, path: Path | None) -> int:
    """Print a benchmark's results as JSON and, with ``--json PATH``, write them there too."""
    text = json.dumps(results, indent=1)
    print(text)
    if path:
        Path(path).write_text(text + "\n")
    return 0
