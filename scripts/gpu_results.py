"""Render one GPU-tier run (scripts/gpu_tier.sh's results folder) as a Markdown table for docs/gpu.md.

    python scripts/gpu_results.py RESULTS_DIR "TP=1, one H200" > /tmp/section.md

Reads device.txt (card, vLLM and torch versions, commit) and junit.xml from RESULTS_DIR/logs.tgz (or the folder
itself, as older runs left them); prints the run's facts and every test with its outcome, time and, for a failure or skip, the first line of its reason.
"""

from __future__ import annotations

import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path


def outcome(case: ET.Element) -> tuple[str, str]:
    for tag, word in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        found = case.find(tag)
        if found is not None:
            reason = (found.get("message") or found.text or "").strip().splitlines()
            return word, (reason[0] if reason else "")[:160].replace("|", "\\|")
    return "passed", ""


def member(results: Path, name: str) -> str:
    """A file of the run: in the folder, else in its ``logs.tgz`` (where scripts/gpu_tier.sh puts it)."""
    if (results / name).exists():
        return (results / name).read_text()
    with tarfile.open(results / "logs.tgz") as tar:
        return tar.extractfile(f"./{name}").read().decode()


def render(results: Path, title: str) -> str:
    device = member(results, "device.txt").strip().splitlines()
    suite = ET.fromstring(member(results, "junit.xml"))
    cases = list(suite.iter("testcase"))
    lines = [f"### {title}", "", *[f"- {line}" for line in device], ""]
    counts: dict[str, int] = {}
    rows = []
    for case in cases:
        word, reason = outcome(case)
        counts[word] = counts.get(word, 0) + 1
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        rows.append(f"| `{name}` | {word} | {float(case.get('time', 0)):.0f} | {reason} |")
    lines += [", ".join(f"{n} {w}" for w, n in sorted(counts.items())), "",
              "| test | outcome | s | reason |", "| --- | --- | --- | --- |", *rows, ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "GPU tier"))
