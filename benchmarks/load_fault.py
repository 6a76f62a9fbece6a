"""The load-and-fault suite: DFlash, KVFlash and PFlash on together in one `vllm serve` of the trained
Qwen3.6-architecture target (Gated DeltaNet + full attention, its DFlash drafter beside it, PFlash with the trained
scorer), under concurrent streams with client disconnects and aborts in every phase, a KV cache small enough that
vLLM preempts, and a host budget for paged-out KV smaller than the load pages out.

    python -m benchmarks.load_fault --scale gpu|cpu --json OUT.json [--workdir DIR] [--seconds S] [--streams N]

Steps: start the server; send the greedy canaries of every class one at a time (the reference: no load, no
preemption, no abort; ``fixtures/load_fault_canaries.py`` says what each class guards); run the streams
(``fixtures/load_fault_plan.py``: prompts of held-out token ids, log-uniform in length, half greedy, half sampled,
half opted out of PFlash, faults with fixed probabilities) and the canaries again beside them until the time is up,
with pressure rounds in turn: in a host round every stream's next request is a long prompt opted out of PFlash
(their page-outs exceed the host budget), a KV round waits for the requests in flight and sends requests that
outgrow the KV cache together (vLLM preempts; some of them are canaries); then let the requests in flight finish
and wait until the server is idle. A monitor samples ``/health``, the server process and ``/metrics`` every 2 s
throughout (``fixtures/load_fault_client.py``); ``fixtures/load_fault_checks.py`` turns it all into the checks.

The checks (``checks``) and what they promise are in docs/operations.md, "Load and faults (the suite)". The exit
status is 1 when any fails. Progress goes to stdout; the JSON (and the server log beside it, ``OUT.serve.log``) is
written at the end, also when the run is interrupted (SIGTERM, Ctrl-C: ``interrupted`` then fails). The commit is
``$LUCE_GIT_COMMIT`` where set (a copy of the tree without .git), else HEAD.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

from benchmarks.vllm_gpu_common import header
from fixtures.engine_report import text_metric
from fixtures.load_fault_canaries import reference_plans, rotation
from fixtures.load_fault_checks import evaluate
from fixtures.load_fault_client import Monitor, http_client, read_ledger, send
from fixtures.load_fault_plan import (PROFILES, Profile, RequestPlan, host_round_request, kv_round_requests,
                                      pressure_rounds, prompt_ids, stream_plan)
from fixtures.serve_load import scrape
from fixtures.trained import heldout_ids

SERVED = "t"
DRAIN_S = {"cpu": 90, "gpu": 90}  # requests in flight at the end of the load get this long to finish
IDLE_WAIT_S = {"cpu": 30, "gpu": 60}  # the longest wait for the idle state after the load
START_TIMEOUT_S = {"cpu": 300, "gpu": 600}
# vLLM's own additional setting on Hopper (tests/gpu/conftest.py: the kit has no FlashInfer).
GPU_VLLM_ADDITIONAL = {"gdn_prefill_backend": "triton"}
# --without NAME: the profile's switch it turns off (luce: vLLM alone)
WITHOUT = {"dflash": "dflash", "pflash": "pflash", "cold": "gpu_cold", "aborts": "aborts", "luce": "luce"}
POLICIES = ("lru", "qk", "bounds", "salient", "scorer")  # luce.kvflash.policy's values outside SFI
CPU_ONLY_ENV = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND")


class Interrupted(BaseException):
    """SIGTERM: stop, and still write what was measured."""


def models(scale: str, workdir: Path) -> Path:
    """The target with its drafter as the sibling ``<target>-DFlash``; on the GPU as a real Qwen3.6 checkpoint is
    (``Qwen3_5ForConditionalGeneration``: vLLM 0.26 serves no text-only ``Qwen3_5ForCausalLM``)."""
    from fixtures.trained import served_pair, trained_model

    if scale == "cpu":
        return served_pair(workdir)
    from fixtures.conditional import as_conditional_generation

    target = as_conditional_generation(trained_model("qwen36-target"), workdir / "gpu-models" / "qwen36")
    drafter = target.with_name("qwen36-DFlash")
    if not drafter.exists():
        drafter.symlink_to(trained_model("qwen36-dflash"), target_is_directory=True)
    return target


def luce_config(profile: Profile, ledger: Path) -> dict:
    from fixtures.trained import trained_model

    # one request may hold the whole budget (auto: half of it): the longest prompts page out more than half. The two
    # diagnostics: paged canaries' chunk choices for their comparison, and every page-in checked against its page-out
    luce = {"kvflash": {"pool_tokens": profile.pool_tokens, "host_bytes": profile.host_bytes,
                        "host_request_bytes": profile.host_bytes, "host_ledger": str(ledger),
                        "gpu_cold": profile.gpu_cold, "log_choices": True, "verify_pages": True}}
    if profile.kvflash_policy:
        luce["kvflash"]["policy"] = profile.kvflash_policy
    if profile.pflash:
        luce["pflash"] = {"drafter": str(trained_model("scorer")), "keep_ratio": profile.pflash_keep_ratio,
                          "min_prompt_tokens": profile.pflash_min_prompt}
    return {"luce": luce}


def server_args(profile: Profile, ledger: Path) -> list[str]:
    additional = luce_config(profile, ledger) if profile.luce else {}
    args = ["--max-model-len", str(profile.max_model_len), "--dtype", "bfloat16", "--no-enable-prefix-caching",
            "--max-num-seqs", str(profile.max_num_seqs), "--seed", "0"]
    if profile.dflash and profile.luce:
        args += ["--speculative-model", "dflash"]
    if profile.kv_blocks is not None:
        args += ["--num-gpu-blocks-override", str(profile.kv_blocks)]
    if profile.kv_cache_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(profile.kv_cache_bytes), "--gpu-memory-utilization", "0.3"]
        additional = {**GPU_VLLM_ADDITIONAL, **additional}
    return [*args, "--additional-config", json.dumps(additional)]


def make_server(scale: str, profile: Profile, workdir: Path, ledger: Path, log: Path):
    from fixtures.server import Server

    server = Server(models(scale, workdir), log, *server_args(profile, ledger), served_name=SERVED)
    if not profile.luce:  # vLLM alone: no plugin loads
        server.env["VLLM_PLUGINS"] = ""
    if scale == "gpu":  # vLLM's GPU defaults (CUDA graphs), a context past the model's 32K positions
        server.args = [a for a in server.args if a != "--enforce-eager"]
        server.env = {k: v for k, v in server.env.items() if k not in CPU_ONLY_ENV}
        server.env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    return server


def device(scale: str) -> str:
    if scale == "gpu":
        try:
            return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            return "GPU (nvidia-smi not found)"
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    return f"CPU ({model}, {os.cpu_count()} cores)"


def vllm_version(base_url: str | None, log: str) -> str:
    """The server's ``/version``, else the engine's start line in its log."""
    if base_url:
        try:
            return json.loads(urllib.request.urlopen(base_url.removesuffix("/v1") + "/version", timeout=10).read())[
                "version"]
        except (OSError, ValueError, KeyError):
            pass
    found = re.search(r"LLM engine \(v([^)]+)\)", log)
    return found.group(1) if found else "unknown"


def metrics_now(base_url: str) -> str:
    try:
        return scrape(base_url)
    except OSError as e:
        return f"# scrape failed: {e}\n"


def wait_idle(base_url: str, timeout: float) -> tuple[str, float]:
    """The scrape once nothing runs or waits and KVFlash and PFlash hold nothing (worker values lag up to 1 s), or
    the last one at ``timeout``; and the seconds waited."""
    from fixtures.engine_report import text_metric as m

    start = time.monotonic()
    busy = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:luce_kvflash_requests", "vllm:luce_kvflash_host_bytes", "vllm:luce_kvflash_host_reserved_bytes",
            "vllm:luce_pflash_queue_depth")
    while True:
        text = metrics_now(base_url)
        if all(m(text, name) == 0 for name in busy) and "# scrape failed" not in text:
            time.sleep(2.5)  # every process's snapshot of the idle state published (at most 1 s old), then read
            return metrics_now(base_url), round(time.monotonic() - start, 1)
        if time.monotonic() - start > timeout:
            return text, round(time.monotonic() - start, 1)
        time.sleep(0.5)


async def run_load(run: dict, server, profile: Profile, monitor: Monitor, seed: int) -> None:
    """The streams and the canary stream until ``profile.seconds`` have passed, with the pressure rounds, then the
    requests in flight until they end or ``DRAIN_S`` has passed (those still running then count as failed)."""
    corpus, t0 = heldout_ids(), run["t0"]
    deadline = t0 + profile.seconds
    in_flight: dict[int, RequestPlan] = {}
    resume = asyncio.Event()  # cleared while a KV round waits for the requests in flight and runs
    resume.set()
    rounds = pressure_rounds(profile)
    host_rounds = [(k, start) for k, (start, kind) in enumerate(rounds) if kind == "host"]

    async def one(client, plan, logprobs=False):
        key = id(plan)
        in_flight[key] = plan
        try:
            out = await send(client, server.base_url, SERVED, plan, prompt_ids(plan, corpus), t0,
                             profile.request_timeout_s, logprobs)
        finally:
            del in_flight[key]
        if (plan.fault == "verify" and out.status == "aborted") or plan.canary == "drafting":
            out.gate_speculating = monitor.speculating_at(out.ended)
        return out

    async def next_turn() -> bool:
        """Wait while a KV round runs; False once the load's time is up."""
        await resume.wait()
        return time.monotonic() < deadline

    async def stream(client, index: int):
        served = 0  # host rounds this stream has sent its request for
        for plan in stream_plan(profile, seed, index, len(corpus)):
            if not await next_turn():
                return
            due = sum(time.monotonic() - t0 >= start for _, start in host_rounds)
            if due > served:  # the latest round that started (a stream busy through a whole round skips it)
                served = due
                pressure = host_round_request(profile, seed, index, host_rounds[due - 1][0], len(corpus))
                run["outcomes"].append(await one(client, pressure))
                if not await next_turn():
                    return
            run["outcomes"].append(await one(client, plan))

    async def canary_stream(client, first: int):
        plans, k = rotation(profile, len(corpus)), first
        while await next_turn():
            run["canaries"].append(await one(client, plans[k % len(plans)], logprobs=True))
            k += profile.canary_streams
            await asyncio.sleep(profile.canary_gap_s)

    async def kv_rounds(client):
        """Each KV round: no new request until those in flight end, then the round's requests at once (they fit the
        KV cache with a block to spare and grow: vLLM preempts), then the load goes on."""
        for number, (start, kind) in enumerate(rounds):
            if kind != "kv":
                continue
            await asyncio.sleep(max(0.0, t0 + start - time.monotonic()))
            resume.clear()
            began = time.monotonic()
            while in_flight and time.monotonic() - began < profile.request_timeout_s:
                await asyncio.sleep(0.1)
            before = metrics_now(server.base_url)
            outs = await asyncio.gather(*(one(client, plan, logprobs=bool(plan.canary))
                                          for plan in kv_round_requests(profile, seed, number, len(corpus))))
            run["outcomes"] += [o for o in outs if not o.plan.canary]
            run["canaries"] += [o for o in outs if o.plan.canary]  # compared with their reference
            after = metrics_now(server.base_url)
            run["kv_rounds"].append({"round": number, "start_s": round(began - t0, 1),
                                     "seconds": round(time.monotonic() - began, 1),
                                     "preemptions": text_metric(after, "vllm:num_preemptions_total")
                                     - text_metric(before, "vllm:num_preemptions_total")})
            resume.set()

    async def progress():
        while True:
            await asyncio.sleep(30 if profile.name == "gpu" else 10)
            outs = run["outcomes"]
            counts = {s: sum(o.status == s for o in outs) for s in ("completed", "refused", "aborted", "failed")}
            row = monitor.samples[-1] if monitor.samples else {}
            print(f"[{time.monotonic() - t0:6.0f} s] requests {len(outs)} {counts}, canaries {len(run['canaries'])}, "
                  f"in flight {len(in_flight)}; preemptions {row.get('preemptions')}, held-back steps "
                  f"{row.get('held_back_steps')}, host bytes {row.get('host_bytes')}, running {row.get('running')}, "
                  f"waiting {row.get('waiting')}", flush=True)

    client = http_client()
    ticker = asyncio.create_task(progress())
    tasks = [asyncio.create_task(stream(client, i)) for i in range(profile.streams)]
    tasks += [asyncio.create_task(canary_stream(client, i)) for i in range(profile.canary_streams)]
    tasks.append(asyncio.create_task(kv_rounds(client)))
    try:
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()) + DRAIN_S[profile.name])
        run["unfinished"] = [f"{plan.name} ({plan.fault}, {plan.prompt_tokens} prompt tokens): still running "
                             f"{DRAIN_S[profile.name]} s after the load ended" for plan in in_flight.values()]
        for task in pending:  # cancelling closes their connections: the server aborts them
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    finally:
        ticker.cancel()
        await client.aclose()


def run_suite(args, run: dict) -> None:
    profile = run["profile_obj"]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="load-fault-"))
    workdir.mkdir(parents=True, exist_ok=True)
    ledger = workdir / "kvflash-host-ledger"
    ledger.unlink(missing_ok=True)
    run["ledger"] = str(ledger)
    heldout_ids()  # tokenized before the clock starts
    server = run["server"] = make_server(args.scale, profile, workdir, ledger, workdir / "serve.log")
    run["server_args"] = server.args[1:]
    t = time.monotonic()
    print(f"starting vllm serve ({args.scale}: {profile.streams} streams, {profile.seconds:.0f} s of load)", flush=True)
    server.start(timeout=START_TIMEOUT_S[args.scale])
    run["vllm"] = vllm_version(server.base_url, "")
    run["timings"]["server_start_s"] = round(time.monotonic() - t, 1)
    print(f"server healthy after {run['timings']['server_start_s']} s", flush=True)

    t = time.monotonic()
    corpus = heldout_ids()
    plans = reference_plans(profile, args.seed, len(corpus))
    run["reference_plans"] = [plan.name for plan in plans]
    by_class = run["timings"]["reference_by_class_s"] = {}

    def gate() -> tuple[float, float]:
        """The gate's speculating gauge and speculative steps, once every process published its latest (1 s)."""
        time.sleep(1.5)
        text = metrics_now(server.base_url)
        return (text_metric(text, "vllm:luce_dflash_gate_speculating"),
                text_metric(text, "vllm:luce_dflash_gate_steps_total", mode="spec"))

    async def reference():
        client = http_client()
        try:
            for plan in plans:  # one at a time: no load, no preemption, no abort
                began = time.monotonic()
                steps = gate()[1] if plan.canary == "drafting" else 0.0
                out = await send(client, server.base_url, SERVED, plan, prompt_ids(plan, corpus), t,
                                 profile.request_timeout_s, logprobs=True)
                if plan.canary == "drafting":
                    out.gate_speculating, spec = gate()
                    out.gate_spec_steps = spec - steps
                run["reference"].append(out)
                by_class[plan.canary] = round(by_class.get(plan.canary, 0.0) + time.monotonic() - began, 1)
        finally:
            await client.aclose()

    asyncio.run(reference())
    print(f"reference: {len(run['reference'])} canaries, seconds per class {by_class}", flush=True)
    run["before"], _ = wait_idle(server.base_url, IDLE_WAIT_S[args.scale])
    run["ledger_before"] = read_ledger(str(ledger))
    run["timings"]["reference_s"] = round(time.monotonic() - t, 1)

    run["t0"] = time.monotonic()
    monitor = run["monitor"] = Monitor(server, str(ledger), run["t0"])
    monitor.halfway_at = profile.seconds / 2
    monitor.start()
    asyncio.run(run_load(run, server, profile, monitor, args.seed))
    run["timings"]["load_and_drain_s"] = round(time.monotonic() - run["t0"], 1)
    print(f"load done: {len(run['outcomes'])} requests, {len(run['canaries'])} canaries; waiting for idle", flush=True)
    run["after"], run["timings"]["idle_wait_s"] = wait_idle(server.base_url, IDLE_WAIT_S[args.scale])
    run["ledger_after"] = read_ledger(str(ledger))
    monitor.sample()  # the idle state in the monitor too (health, process)
    run["finished"] = True


def write(run: dict, args) -> bool:
    """Evaluate whatever was measured, print the summary and the checks, write the JSON; True when all passed."""
    server, monitor = run.get("server"), run.get("monitor")
    log = server.log_text() if server is not None and server.log_path.exists() else ""
    run["timings"]["total_s"] = round(time.monotonic() - run["started"], 1)
    if not run.get("after") and monitor is not None:  # interrupted: the figures as of the latest sample
        run["after"] = monitor.latest_text
    summary, checks, details = evaluate(run, log)
    report = {**run["header"], "device": device(args.scale), "vllm": run.get("vllm") or vllm_version(None, log),
              "scale": args.scale,
              "seed": args.seed, "profile": run["profile"], "server_args": run.get("server_args"),
              "timings": run["timings"], "summary": summary,
              "checks": checks, "passed": all(c["ok"] for c in checks.values()), **details,
              "monitor": monitor.samples if monitor else [],
              "requests": [o.as_dict() for o in run["outcomes"]],
              "canary_runs": [o.as_dict(with_text=True) for o in run["reference"] + run["canaries"]]}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    if log:
        out.with_suffix(".serve.log").write_text(log[-4_000_000:])
    print(json.dumps({k: report[k] for k in ("date", "git_commit", "device", "vllm", "timings")}), flush=True)
    print("summary: " + json.dumps(summary), flush=True)
    for name, check in checks.items():
        print(f"{'PASS' if check['ok'] else 'FAIL'} {name}: {check['detail']}", flush=True)
    print(f"{'all checks passed' if report['passed'] else 'CHECKS FAILED'}; JSON: {out}", flush=True)
    return report["passed"]


def profile_of(args) -> Profile:
    profile = replace(PROFILES[args.scale].scaled(args.seconds, args.streams, args.canary_streams),
                      **{WITHOUT[name]: False for name in args.without})
    if args.kvflash_policy:
        profile = replace(profile, kvflash_policy=args.kvflash_policy)
    if not profile.luce:  # vLLM alone: none of the features, and the checks of vLLM's own behaviour only
        profile = replace(profile, dflash=False, pflash=False)
    return profile


def main_profile(argv: list[str]) -> Profile:
    """The profile ``main`` runs for these arguments (without running it)."""
    return profile_of(parser().parse_args(argv))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--scale", choices=sorted(PROFILES), required=True)
    ap.add_argument("--json", required=True, help="where the results go (and OUT.serve.log beside it)")
    ap.add_argument("--workdir", help="models, the host ledger and the server log (default: a new temp folder)")
    ap.add_argument("--seconds", type=float, help="seconds of load (the profile's: gpu 480, cpu 75)")
    ap.add_argument("--streams", type=int, help="concurrent streams besides the canaries (gpu 64, cpu 8)")
    ap.add_argument("--canary-streams", type=int, help="streams that send the canaries in turn (gpu 1, cpu 2)")
    ap.add_argument("--without", action="append", choices=WITHOUT, default=[],
                    help="run with one thing off, to rule it in or out of a finding (repeatable)")
    ap.add_argument("--kvflash-policy", choices=POLICIES,
                    help="KVFlash's chunk policy instead of the default (lru: by position alone, to rule the scores "
                         "in or out of a paged canary's change)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    profile = profile_of(args)
    command = ["benchmarks.load_fault", *(argv if argv is not None else sys.argv[1:])]
    run = {"header": header(command), "profile": profile.__dict__, "profile_obj": profile, "started": time.monotonic(),
           "served": SERVED, "timings": {}, "kv_rounds": [], "reference": [], "canaries": [], "outcomes": [],
           "unfinished": [], "finished": False}

    def interrupt(*_):
        raise Interrupted()

    signal.signal(signal.SIGTERM, interrupt)
    try:
        run_suite(args, run)
    except (Interrupted, KeyboardInterrupt):
        run["interrupted"] = "interrupted (SIGTERM or Ctrl-C)"
        print("interrupted: writing what was measured", flush=True)
    except Exception as e:  # noqa: BLE001 - a failed start or run is reported as such, with what it had
        run["interrupted"] = f"{type(e).__name__}: {e}"[:4000]
        print(f"run failed: {run['interrupted']}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if run.get("monitor"):
            run["monitor"].stop()
        passed = write(run, args)
        if run.get("server"):
            run["server"].stop()
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
