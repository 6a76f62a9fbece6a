"""What KVFlash's host admission adds to each scheduler step at vLLM's scale (issue 68): ``HostAdmission`` with a real
``HostLedger`` file, driven as the KVFlash manager drives it: every scheduled request holds and commits each step,
one in ``--long-every`` grows by a chunk of host memory a step, the others (short requests) page nothing.

    python -m benchmarks.kvflash_admission [--requests 256 1024 4096] [--steps 200]

Prints, per count of running requests, the admission's time per step and per request, and the ledger changes per
step; "linear" is the time per step over the first count's, scaled to its requests (1.0: linear). CPU timings of a
CPU-side cost: the scheduler runs on the host CPU on a GPU server too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time

from vllm_luce.kvflash.admission import AdmissionConfig, HostAdmission
from vllm_luce.kvflash.host_ledger import HostLedger

CHUNK_BYTES = 64 * 36 * 8 * 128 * 2 * 2  # one 64-token chunk of Qwen3-8B's shape (36 layers, 8 KV heads, 128, bf16)


def run(requests: int, steps: int, long_every: int, path: str) -> dict:
    ledger = HostLedger(path, 10**15)
    config = AdmissionConfig(chunk_tokens=64, pool_chunks=64, block_size=16, chunk_bytes=CHUNK_BYTES,
                             request_bytes=10**13)
    admission = HostAdmission(config, ledger)
    ids = [f"r{i}" for i in range(requests)]
    grows = [i % long_every == 0 for i in range(requests)]
    start, touches = time.perf_counter(), getattr(admission, "ledger_touches", 0)
    for step in range(1, steps + 1):
        for req_id, long in zip(ids, grows):
            nbytes = step * CHUNK_BYTES if long else 0
            admission.hold(req_id, nbytes)
            admission.commit(req_id, nbytes)
        admission.end_step()
    seconds = time.perf_counter() - start
    ledger.close()
    return {"requests": requests, "ms_per_step": 1e3 * seconds / steps, "us_per_request": 1e6 * seconds / steps /
            requests, "ledger_changes_per_step": (getattr(admission, "ledger_touches", 0) - touches) / steps}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--long-every", type=int, default=8, help="one request in N grows its host memory every step")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(n, args.steps, args.long_every, os.path.join(tmp, f"ledger{n}")) for n in args.requests]
    base = rows[0]["ms_per_step"] / rows[0]["requests"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"device: {cpu_name()} ({os.cpu_count()} cores); commit {commit}; "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}; one request in {args.long_every} grows a chunk a step")
    print("| running requests | ms per step | us per request | ledger changes per step | linear |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        row["linear"] = row["ms_per_step"] / (base * row["requests"])
        print(f"| {row['requests']:,} | {row['ms_per_step']:.3f} | {row['us_per_request']:.2f} | "
              f"{row['ledger_changes_per_step']:.2f} | {row['linear']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"commit": commit, "steps": args.steps, "long_every": args.long_every, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
