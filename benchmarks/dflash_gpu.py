"""DFlash through vLLM on the GPU against vLLM alone (issue 40, deliver 2): output tokens/s by concurrency for no
speculation, vLLM's DFlash at fixed K, vLLM's dynamic speculation (its batch-size table) and vllm-luce's gated
DFlash, with drafters right with probability 0, 0.5 and 0.9 per position, and an A/A control.

    python -m benchmarks.dflash_gpu --json dflash_gpu.json                     # all engines, one GPU after another
    python -m benchmarks.dflash_gpu --gpus 4 --levels 0.9 --json a.json        # engines side by side, one per GPU
    python -m benchmarks.dflash_gpu --tiny --concurrency 1 4 --json t.json     # CPU smoke run (tiny shapes)
    python -m benchmarks.dflash_gpu --gpus 1 --levels 0.0 --modes none split --json p0.json   # the plain step's cost
    python -m benchmarks.dflash_gpu --gpus 4 --card-per-level --resume --json t.json   # the table, a card per level

Models (``fixtures/scaled.py``): a Qwen3-8B-shaped target whose greedy next token is token + 1, and a drafter
of z-lab's Qwen3-8B-DFlash shape whose slot k is right with probability p (so position k is accepted with p^k);
weights are vLLM's ``dummy`` ones, every matmul at its real shape. Engines, each an offline ``LLM`` in a child
process of its own (the test-only classes register in that process, so its engine core runs in it too):
* ``none``, ``control``: no speculation, vLLM alone (``VLLM_PLUGINS`` empty); control over none is the A/A ratio;
* ``fixed``: vLLM alone, DFlash with every draft verified (K = 15);
* ``dynamic``: vLLM alone, DFlash with vLLM's ``num_speculative_tokens_per_batch_size`` (``DYNAMIC_TABLE``);
* ``gated``: vllm-luce with its gate (the default when vLLM speculates with DFlash);
* ``ungated``: vllm-luce with the gate off (``{"dflash": {"gate": false}}``), every draft verified: fixed DFlash
  with the plugin loaded, so that gated against ungated is the gate's own effect;
* ``bare`` (diagnostic, Model Runner V2, not in the default set): gated, with the speculator skipped outright on
  plain steps (no drafter context write either), so that bare against gated is what the speculator costs a plain
  step and bare against none what the rest of a speculating engine costs one. Drafts after a plain run then lack
  their context: run it where acceptance does not matter (p = 0);
* ``unstashed`` (diagnostic, not in the default set): gated with ``dflash.plain_context_stash`` 0, every plain
  step writing the drafter's context (on vLLM 0.26 with Model Runner V2 the default holds it for one later pass);
* ``split`` (diagnostic, not in the default set): one engine that runs ``gated``, ``unstashed`` and ``bare`` one
  after another on the same prompts in every pass (the prefix cache reset before each), reported as those three
  engines (each row's ``engine`` names it): a paired comparison, free of engine-to-engine spread, in one engine
  start.
At each concurrency c (c requests submitted together, prompts of ``--prompt-tokens`` random ids on their own
token ranges, ``--max-tokens`` out, greedy, ``ignore_eos``) an engine runs one warm-up pass (the gate calibrates
there), then ``--repeats`` measured passes; a cell is the median of its passes' output tokens / wall seconds,
prefill included (1K-token prompts: a small share of 256 decode steps), with the median engine step's wall time
(``median_step_ms``: where the gate runs nearly every step plain, what a plain step costs it). Engines on
different GPUs of one host are compared through the A/A control, which runs on its own GPU; ``--gpus 1`` runs
them one after another on one card, which compares them best; ``--card-per-level`` gives each level a card that
measures its own baseline first, so every ratio is within one card (none alone then runs only as the control's
pair), and ``--resume`` lets back-to-back runs in one
``--workdir`` finish a table too long for one run. Goals (issue 40): gated >= 0.97x the better of none
and fixed in every cell; gated >= 3x none at concurrency 1 with p = 0.9.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from benchmarks.vllm_gpu_common import header

MODES = ("none", "control", "fixed", "dynamic", "gated", "ungated", "unstashed", "bare", "split")
DEFAULT_MODES = MODES[:-3]
SPLIT = ("gated", "unstashed", "bare")  # a split engine's variants, reported as engines of those modes
VLLM_ALONE = {"none", "control", "fixed", "dynamic"}
# vLLM's dynamic speculation is a static table of K by batch size (inclusive ranges): the full block for small
# batches, fewer drafts as the batch grows and verification competes with other requests, none beyond 64.
DYNAMIC_TABLE = [(1, 4, 15), (5, 16, 7), (17, 64, 3), (65, 1024, 0)]
def prompts(concurrency: int, length: int, vocab: int, seed: int, span: int) -> list[list[int]]:
    """Request i: ``length`` ids counting up from its own start (the predictable target's own text), starts ``span``
    apart (prompt, output and a block of drafts): distinct anchors, independent drafts, until the vocabulary wraps
    (the last 13 of 128 requests at the 8B shape)."""
    starts = [(seed * 7919 + i * span) % (vocab - span) for i in range(concurrency)]
    return [list(range(s, s + length)) for s in starts]


# ------------------------------------------------------------------ one engine (child process)


def measure(spec: dict) -> dict:
    from vllm import LLM, SamplingParams

    from fixtures.scaled import register_scaled_models

    register_scaled_models()
    llm = LLM(model=spec["target"], load_format="dummy", seed=0, disable_log_stats=False, **spec["llm"])
    variants = SPLIT if spec["mode"] == "split" else (spec["mode"],)
    switch = variant_switch(llm, spec["mode"])
    params = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True, detokenize=False)
    vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
    span = spec["prompt_tokens"] + spec["max_tokens"] + 32
    steps = timed_steps(llm.llm_engine)
    cells = {v: [] for v in variants}
    for c in spec["concurrency"]:
        rates, step_s, counts = ({v: [] for v in variants}, {v: [] for v in variants}, {v: {} for v in variants})
        for i in range(1 + spec["repeats"]):
            texts = prompts(c, spec["prompt_tokens"], vocab, i, span)
            batch = [{"prompt_token_ids": p} for p in texts]
            expected = [[(p[-1] + j) % vocab for j in range(1, spec["max_tokens"] + 1)] for p in texts]
            for variant in variants:  # a split engine's variants run the same prompts one after another
                switch(variant)
                if not llm.reset_prefix_cache():  # a split engine's later variants would reuse the first's prompts
                    raise RuntimeError(f"{spec['name']} ({variant}): the prefix cache did not reset")
                steps.clear()
                before = counters(llm)
                start = time.perf_counter()
                outs = llm.generate(batch, params, use_tqdm=False)
                seconds = time.perf_counter() - start
                if [list(o.outputs[0].token_ids) for o in outs] != expected:
                    raise AssertionError(f"{spec['name']} ({variant}): concurrency {c} pass {i} changed the output")
                if i == 0:
                    continue  # the warm-up pass: the gate calibrates, its drafts are not this cell's
                rates[variant].append(sum(len(o.outputs[0].token_ids) for o in outs) / seconds)
                step_s[variant] += steps
                for k, v in counters(llm).items():
                    counts[variant][k] = counts[variant].get(k, 0) + v - before.get(k, 0)
        for v in variants:
            cells[v].append({"concurrency": c, "tokens_per_s": statistics.median(rates[v]), "passes": rates[v],
                             "median_step_ms": round(1e3 * statistics.median(step_s[v]), 4) if step_s[v] else None,
                             **counts[v]})
    gate = getattr(getattr(llm.llm_engine.engine_core, "engine_core", None), "scheduler", None)
    import torch
    import vllm

    from vllm_luce.spec_decode.gate_report import summary as gate_summary

    summary = gate_summary(gate.luce_gate) if hasattr(gate, "luce_gate") else None
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    found = {"gate": summary, "device": device, "vllm": vllm.__version__, "torch": torch.__version__}
    if spec["mode"] != "split":
        return {"cells": cells[spec["mode"]], **found}
    return {"variants": {v: {"cells": cells[v]} for v in variants}, **found}


def variant_switch(llm, mode: str):
    """A function that puts the engine in one of its variants: ``bare`` skips the speculator on plain steps; a
    ``split`` engine runs ``gated`` (the default stash), ``unstashed`` (the stash holding nothing) and ``bare``."""
    if mode not in ("bare", "split"):
        return lambda variant: None
    worker = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
    bare = skip_speculator_on_plain_steps(worker)
    stash = worker.model_runner.luce_plain_steps.stash
    capacity = stash.capacity if stash is not None else 0

    def switch(variant: str) -> None:
        bare.on = variant == "bare"
        if stash is not None:
            stash.capacity = capacity if variant == "gated" else 0  # 0: every plain step writes its context

    return switch


def skip_speculator_on_plain_steps(worker):
    """The ``bare`` variant: on the gate's plain steps Model Runner V2 skips its speculator's ``propose`` (the
    drafter's context write included) and keeps the drafts it has, which no plain step verifies. Returns the
    switch (``on``)."""
    runner = worker.model_runner
    step = getattr(runner, "luce_plain_steps", None)
    if step is None:
        raise SystemExit("bare: needs the DFlash gate on Model Runner V2 (a dense target on the GPU)")
    speculator = runner.speculator
    propose = speculator.propose
    state = SimpleNamespace(on=True)

    def propose_unless_plain(input_batch, *args, **kwargs):
        if state.on and step.plain and not kwargs.get("dummy_run"):
            return speculator.draft_tokens[:input_batch.num_reqs]
        return propose(input_batch, *args, **kwargs)

    speculator.propose = propose_unless_plain
    return state


def timed_steps(engine) -> list[float]:
    """Wall seconds of each ``engine.step()`` from now on (the list the caller clears): their median is a plain
    step's cost where the gate runs nearly every step plain, its explorations and the prompt steps left out."""
    times, step = [], engine.step

    def timed_step(*args, **kwargs):
        start = time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            times.append(time.perf_counter() - start)

    engine.step = timed_step
    return times


def counters(llm) -> dict:
    from fixtures.engine_report import llm_counters

    found = llm_counters(llm, ("vllm:spec_decode_num_",), labels=False)
    return {name.removeprefix("vllm:spec_decode_"): value for name, value in found.items()}


# ------------------------------------------------------------------ the run


def engine_specs(args, root: Path) -> list[dict]:
    from fixtures import scaled as S

    shape = "tiny" if args.tiny else "qwen3-8b"
    target = S.build_target(root / f"{shape}-target", shape)
    max_len = args.prompt_tokens + args.max_tokens + 64
    base = {"max_model_len": max_len, "max_num_seqs": max(args.concurrency), "dtype": "bfloat16",
            "gpu_memory_utilization": args.gpu_share}
    if args.tiny:
        base = {**base, "enforce_eager": True}
        base.pop("gpu_memory_utilization")
    specs = []
    for mode in args.modes:
        for level in ([None] if mode in ("none", "control") else args.levels):
            llm = dict(base)
            if level is not None:
                drafter = S.build_drafter(root / f"{shape}-drafter-{level}", target, accept=level)
                speculative = {"model": str(drafter), "method": "dflash", "num_speculative_tokens": args.k}
                if mode == "dynamic":
                    speculative["num_speculative_tokens_per_batch_size"] = [list(r) for r in args.dynamic_table]
                llm["speculative_config"] = speculative
            if mode not in VLLM_ALONE:
                llm["additional_config"] = luce_config(mode)
            name = mode if level is None else f"{mode}@{level}"
            specs.append({"name": name, "mode": mode, "level": level, "target": str(target), "llm": llm,
                          "plugins": mode not in VLLM_ALONE, "concurrency": args.concurrency,
                          "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens, "repeats": args.repeats})
    if args.card_per_level:  # each level's card measures its own baseline first
        none = next((s for s in specs if s["name"] == "none"), None)
        if none is None:
            raise SystemExit("--card-per-level: needs the none mode (each level's baseline)")
        alone = [s for s in specs if s["name"] != "none" or "control" in args.modes]  # none: the control's pair
        specs = [*({**none, "name": f"none@{level}", "level": level} for level in args.levels), *alone]
    return specs


def luce_config(mode: str) -> dict:
    """vllm-luce's ``--additional-config`` for a mode with the plugin."""
    stash = {"plain_context_stash": 0} if mode == "unstashed" else {}
    dflash = {"gate": mode != "ungated"} | stash
    return {"luce": {"dflash": dflash}}


def run_child(spec: dict, workdir: Path, gpu: int | None, timeout: float, resume: bool = False) -> dict:
    path = workdir / f"{spec['name'].replace('@', '-')}.json"  # the device's $OUT returns no name with an @
    result_path = path.with_suffix(".out.json")
    if resume and result_path.is_file() and path.is_file() and json.loads(path.read_text()) == spec:
        return {**json.loads(result_path.read_text()), "name": spec["name"]}  # measured by an earlier call
    result_path.unlink(missing_ok=True)
    path.write_text(json.dumps(spec))
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONUNBUFFERED="1")
    if not spec["plugins"]:
        env["VLLM_PLUGINS"] = ""
    if gpu is not None:  # the gpu-th of the devices this process may use
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[gpu] if visible else str(gpu)
    log = path.with_suffix(".log")
    with open(log, "w") as out:
        try:
            proc = subprocess.run([sys.executable, "-m", "benchmarks.dflash_gpu", "--child", str(path)], env=env,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
            status = proc.returncode
        except subprocess.TimeoutExpired:
            status = "timeout"
    if status == 0 and result_path.is_file():
        return {**json.loads(result_path.read_text()), "name": spec["name"]}
    tail = log.read_text(errors="replace")[-2000:]
    return {"name": spec["name"], "error": f"exit {status}", "log_tail": tail}


def run_all(specs: list[dict], workdir: Path, gpus: int, timeout: float, card_per_level: bool = False,
            resume: bool = False) -> dict:
    """Up to ``gpus`` engines at once, each on its own GPU (one after another on one GPU or the CPU). With
    ``card_per_level`` a card runs one level's engines one after another (its baseline first), and another card
    the level-free ones (none and the A/A control)."""
    free = list(range(gpus)) if gpus > 0 else [None]
    groups: dict = {}
    for spec in specs:
        groups.setdefault(spec["level"] if card_per_level else spec["name"], []).append(spec)

    def one_card(group):
        gpu = free.pop()
        try:
            found = []
            for spec in group:
                print(f"[{time.strftime('%H:%M:%S')}] {spec['name']} on GPU {gpu}", flush=True)
                found.append(run_child(spec, workdir, gpu, timeout, resume))
            return found
        finally:
            free.append(gpu)

    with ThreadPoolExecutor(max_workers=max(1, gpus)) as pool:
        return {r["name"]: r for found in pool.map(one_card, groups.values()) for r in found}


def expand_split(results: dict) -> dict:
    """A split engine's variants as engines of their own modes (``split@0.0`` -> ``gated@0.0``,
    ``unstashed@0.0``, ``bare@0.0``), each marked with the engine it ran in."""
    out = {}
    for name, r in results.items():
        if "variants" not in r:
            out[name] = r
            continue
        level = name.split("@", 1)[1]
        shared = {k: v for k, v in r.items() if k not in ("variants", "name")}
        for variant, found in r["variants"].items():
            out[f"{variant}@{level}"] = {**found, **shared, "name": f"{variant}@{level}", "engine": name}
    return out


def table(results: dict, levels: list[float], concurrency: list[int]) -> tuple[list[dict], list[str]]:
    """One row per (level, concurrency): tokens/s of none and ratios of the others to it; the goals' verdicts."""
    rows, misses = [], []

    def cell(name, c) -> dict:
        return next((x for x in results.get(name, {}).get("cells", []) if x["concurrency"] == c), {})

    for level in levels:
        baseline = f"none@{level}" if f"none@{level}" in results else "none"  # the level's own card's, if it ran one

        def engine(mode):
            return {"none": baseline, "control": "control"}.get(mode, f"{mode}@{level}")

        for c in concurrency:
            none = cell(baseline, c).get("tokens_per_s")
            row = {"level": level, "concurrency": c, "none_tok_s": none and round(none, 1)}
            for mode in MODES[1:]:
                r = cell(engine(mode), c).get("tokens_per_s")
                base = cell("none", c).get("tokens_per_s") if mode == "control" else none  # A/A: one card
                row[f"{mode}/none"] = round(r / base, 3) if r and base else None
            steps = {mode: cell(engine(mode), c).get("median_step_ms") for mode in MODES}
            row["median_step_ms"] = {mode: ms for mode, ms in steps.items() if ms is not None}
            fixed = cell(f"fixed@{level}", c)
            row["accepted_per_draft(fixed)"] = round(fixed["num_accepted_tokens"] / fixed["num_drafts"], 2) \
                if fixed.get("num_drafts") else None
            if row["gated/none"] is not None and row["fixed/none"] is not None:  # the goal needs both
                best = max(1.0, row["fixed/none"])
                row["gated/best"] = round(row["gated/none"] / best, 3)
                if row["gated/best"] < 0.97:
                    misses.append(f"p={level} c={c}: gated {row['gated/best']}x the better of none and fixed")
                if level == max(levels) and c == 1 and level >= 0.9 and row["gated/none"] < 3.0:
                    misses.append(f"p={level} c=1: gated {row['gated/none']}x none (goal 3x)")
            rows.append(row)
    return rows, misses


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        spec = json.loads(Path(argv[1]).read_text())
        Path(argv[1]).with_suffix(".out.json").write_text(json.dumps(measure(spec)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", type=float, nargs="+", default=[0.0, 0.5, 0.9])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64, 128])
    ap.add_argument("--modes", nargs="+", default=list(DEFAULT_MODES), choices=MODES)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--k", type=int, default=15)
    ap.add_argument("--dynamic-table", type=json.loads, default=DYNAMIC_TABLE,
                    help='the dynamic mode\'s table as JSON, e.g. "[[1, 1024, 0]]": K = 0 at every batch size measures '
                         'what a plain step costs inside a speculative engine')
    ap.add_argument("--gpus", type=int, default=None, help="engines side by side, one per GPU (default: all GPUs)")
    ap.add_argument("--gpu-share", type=float, default=0.85)
    ap.add_argument("--timeout", type=float, default=540.0, help="seconds per engine")
    ap.add_argument("--card-per-level", action="store_true",
                    help="each level's engines one after another on a card of their own, after that card's own "
                         "no-speculation baseline (none@LEVEL, the level's ratios' denominator); none and the A/A "
                         "control on another card")
    ap.add_argument("--resume", action="store_true",
                    help="keep the results of engines an earlier run in the same --workdir finished with the same "
                         "spec (a table longer than one device call, over back-to-back calls)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on whatever device (CPU smoke run)")
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("LUCE_BENCH_DIR", "/tmp/luce-dflash-gpu")))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.tiny:
        args.prompt_tokens, args.max_tokens = min(args.prompt_tokens, 64), min(args.max_tokens, 32)
    import torch

    gpus = torch.cuda.device_count() if args.gpus is None else args.gpus
    args.workdir.mkdir(parents=True, exist_ok=True)
    out = {**header(["benchmarks.dflash_gpu", *argv]), "dynamic_table": args.dynamic_table, "args": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    results = run_all(engine_specs(args, args.workdir / "models"), args.workdir, gpus, args.timeout,
                      args.card_per_level, args.resume)
    results = expand_split(results)
    out["engines"] = results
    out["rows"], out["goals_missed"] = table(results, args.levels, args.concurrency)
    for row in out["rows"]:
        print(json.dumps(row))
    for name, r in results.items():
        if "error" in r:
            print(f"{name}: {r['error']}\n{r['log_tail']}")
        elif r.get("gate"):
            print(f"{name}: {r['gate']}")
    print("goals missed:", out["goals_missed"] or "none")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
