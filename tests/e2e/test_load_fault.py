"""The load-and-fault suite at CPU scale (``python -m benchmarks.load_fault --scale cpu``) through a real `vllm serve`
with DFlash, KVFlash and PFlash on: 8 streams for 60 s, client disconnects and aborts in every phase, a KV cache of 106
blocks (vLLM preempts), a host budget of 40 chunks (requests are held back), greedy canaries of every class but kv
(short, long, pflash, drafting) against the same canaries run alone. Every check of the suite must pass, the paged
canaries' included (long and pflash canaries, whose context KVFlash pages: its decisions fall at positions fixed by
the request alone); what each check promises is in docs/operations.md, "Load and faults (the suite)". It takes a few
minutes in CI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    work = tmp_path_factory.mktemp("load-fault")
    out = work / "load_fault.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.load_fault", "--scale", "cpu", "--json", str(out),
                           "--workdir", str(work)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    assert out.is_file(), f"no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return {"exit": proc.returncode, **json.loads(out.read_text()), "log": (work / "serve.log").read_text(
        errors="replace")}



def test_every_check_of_the_suite_passes(report):
    failed = {name: check["detail"] for name, check in report["checks"].items()
              if not check["ok"]}
    assert failed == {}, json.dumps(failed, indent=1) + "\nserver log tail:\n" + report["log"][-3000:]
    assert report["exit"] == (0 if report["passed"] else 1)


def test_the_load_reached_every_pressure_the_suite_promises(report):
    """Not only no failure: the run did what it is for (each is also a check; here with the figures)."""
    summary = report["summary"]
    assert summary["load_requests"] >= 40, summary
    assert all(row["aborted"] > 0 for fault, row in summary["faults"].items() if fault != "none"), summary["faults"]
    assert summary["preemptions"] > 0 and summary["held_back_steps"] > 0
    assert summary["host_page_outs"] > 0 and summary["pflash_outcomes"].get("compressed", 0) > 0
    canaries = summary["canaries"]
    print(json.dumps(canaries, indent=1))
    assert set(canaries) == {"short", "long", "pflash", "drafting", "total"}, canaries  # kv: the GPU profile's
    assert all(row["greedy_compared"] > 0 for row in canaries.values()), canaries
    assert all(canaries[kind]["mismatches"] == 0 for kind in ("short", "drafting")), canaries
    # paged canaries' chunk choices reach the server log (luce.kvflash.log_choices), for their comparison: every long
    # canary's, and the pflash canaries' that PFlash leaves longer than the pool
    (long_found, long_runs), (pflash_found, _) = [canaries[kind]["choices_logged"].split(" of ")
                                                  for kind in ("long", "pflash")]
    assert long_found == long_runs != "0" and int(pflash_found) > 0, canaries
