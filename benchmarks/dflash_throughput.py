"""CPU, through real vLLM: decode throughput with no speculation, fixed DFlash and gated DFlash.

    python -m benchmarks.dflash_throughput --json dflash_throughput.json

Pairs:
* ``right`` / ``wrong``: the predictable target (next token = token + 1) with a drafter that
  is always right or always wrong (``fixtures/predictable.py``);
* ``trained``: the trained Qwen3.6-architecture pair (``tests/assets/trained``) on held-out code.

For each pair, the engines live in one process: no speculation, DFlash with every draft verified
(``fixed``: the gate off), and DFlash under vllm-luce's gate (``gated``); ``--modes none gated``
leaves fixed out (on a CPU, fixed DFlash on the trained pair runs several times slower than the
others). ``--modes none control gated`` adds ``control``, a second engine without speculation:
its throughput over ``none``'s is an A/A ratio, the difference two identical engines show in this run.
That ratio's median strays from 1 by a tenth or more on a CPU host (the runs in
``docs/data/dflash_throughput/``), so a gated/none median is read against it; with ``control`` the table
also gives gated over the mean of both engines without speculation, a baseline with less bias. ``gated2`` adds a
second gated engine: with ``control`` too, the table gives both gated engines over both plain ones, round by round
(``pair / pair``), the ratio with the least bias this benchmark measures, and the goal is checked on it (the step-cost
benchmark, ``benchmarks/dflash_step_cost.py``, pairs engines the same way). ``--instances N``
builds each pair's engines N times, each set in a child process of its own, and pools their rounds per
cell: that averages the bias of one set of engines, which more rounds of the same set cannot. At each
concurrency (requests submitted together) every engine runs a warm-up pass (the gate calibrates there),
then the engines take turns for ``--repeats`` measured passes each, so a drift of the machine's speed
reaches them all alike. Round orders form a balanced Latin square (``round_orders``): each engine runs in each place of
a round, and after each other engine, equally often over ``len(modes)`` rounds (twice as many for an odd count). A
rotating order would keep every engine behind the same one (the gated engine right after ``fixed`` in every round),
so whatever one pass leaves behind on the host would fall on the same engine each round.
Throughput is generated tokens / wall seconds; a cell is the median of its passes (all of them are in
the JSON). A ratio is the median over rounds of the two engines' ratio within a round:
a shared host's speed can halve for seconds at a time (other tenants; CPU time slows with it), and
passes of one round see the same speed. Goals (issue 4): gated >= 0.95x none
everywhere; gated >= 0.9x fixed where fixed beats none.

Each pair runs in a child process of its own: vLLM's global parallel groups do not survive a second
set of engines in one process ("pipeline model parallel group is not initialized").

Every engine gets the same KV budget, ``--kv-cache-gib`` (4 GiB, set here even when the environment
sets another). A speculating engine on a hybrid target holds 1 + num_speculative_tokens Gated
DeltaNet state blocks per request in vLLM (``num_speculative_blocks``): under a 1 GiB budget it
admits only part of 64 requests that the plain engine runs all of, which measures memory, not the gate. The
measured pass reports the most requests that ran at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

for _k, _v in {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_HOST_IP": "127.0.0.1",
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_k, _v)

MODES = ("none", "control", "fixed", "gated", "gated2")  # control, gated2: a second engine of a kind
# Engines are built in a mirrored order: the plain pair and the gated pair take the same mean place. An engine built
# later in the process runs slower, by enough to turn a gated/plain step-time comparison round.
BUILD_ORDER = ("none", "gated", "fixed", "gated2", "control")
GOAL_VS_NONE = 0.95  # gated over no speculation, everywhere (issue 4)
GOAL_VS_FIXED = 0.9  # gated over fixed DFlash, where fixed beats no speculation


def pairs(root: Path) -> dict:
    from fixtures import predictable as P
    from fixtures.trained import trained_model

    P.register_predictable_drafter()
    target = P.build_target(root / "predictable-target")
    return {
        "right": (target, P.build_drafter(target, root / "predictable-right", offset=0), "dflash"),
        "wrong": (target, P.build_drafter(target, root / "predictable-wrong", offset=P.WRONG_OFFSET), "dflash"),
        "trained": (trained_model("qwen36-target"), trained_model("qwen36-dflash"), None),
    }


def prompts_for(pair: str, llm, n: int) -> list[dict]:
    if pair == "trained":
        from benchmarks import fidelity as F

        base = F.code_prompts(llm.get_tokenizer(), 16)
        return [{"prompt_token_ids": base[i % len(base)][: 64 + i % 7]} for i in range(n)]
    return [{"prompt_token_ids": [(100 + 37 * i + j) % 1000 for j in range(16)]} for i in range(n)]


def build(target, drafter, method, mode: str, max_seqs: int):
    from vllm import LLM

    spec = None
    if mode not in ("none", "control"):
        spec = {"model": str(drafter), **({"method": method} if method else {})}
    return LLM(model=str(target), speculative_config=spec, enforce_eager=True, max_model_len=1024, dtype="bfloat16",
               seed=0, enable_prefix_caching=False, max_num_seqs=max_seqs, disable_log_stats=False,
               additional_config={"luce": {"dflash": {"gate": mode in ("gated", "gated2")}}})


def round_orders(names, rounds: int) -> list[list]:
    """``rounds`` orders of ``names``, from a Williams design (a balanced Latin square), repeated: over its rows each
    name takes each place once and directly follows each other name once (n rows for an even count of names; for an
    odd one, n rows and their reverses, where each follows each other twice)."""
    n = len(names)
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(i + shift) % n for i in first] for shift in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return [[names[i] for i in rows[r % len(rows)]] for r in range(rounds)]


def run_pass(llm, prompts, tokens: int) -> tuple[float, int]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    return wall, sum(len(o.outputs[0].token_ids) for o in outs)


@contextlib.contextmanager
def peak_scheduled(llm):
    """Yields a one-item list that holds, while the block runs, the most requests one step of ``llm``'s scheduler
    scheduled."""
    sched = llm.llm_engine.engine_core.engine_core.scheduler
    peak, schedule = [0], sched.schedule

    def counted(*args, **kwargs):
        out = schedule(*args, **kwargs)
        peak[0] = max(peak[0], len(out.num_scheduled_tokens))
        return out

    sched.schedule = counted
    try:
        yield peak
    finally:
        del sched.schedule  # back to the class's method


def run_measured(llm, prompts, tokens: int) -> tuple[float, int, int]:
    """``run_pass`` that also returns the most requests the scheduler ran at once."""
    with peak_scheduled(llm) as peak:
        wall, generated = run_pass(llm, prompts, tokens)
    return wall, generated, peak[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--pairs", nargs="+", default=["right", "wrong", "trained"])
    ap.add_argument("--tokens", type=int, default=96, help="generated tokens per request (measured pass)")
    ap.add_argument("--repeats", type=int, default=3, help="measured passes per engine and concurrency (median)")
    ap.add_argument("--kv-cache-gib", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE of every engine")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=["none", "fixed", "gated"],
                    help="engines to run (without fixed, the gated/fixed goal is not checked; control: an A/A "
                         "engine without speculation)")
    ap.add_argument("--instances", type=int, default=1,
                    help="fresh engines per pair, each set in a child process of its own; a cell pools their rounds")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.instances < 1:
        ap.error(f"--instances must be >= 1, got {args.instances}")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_cache_gib)
    if len(args.pairs) > 1 or args.instances > 1:
        rows = run_pairs_apart(args.pairs, args.instances, argv if argv is not None else sys.argv[1:])
        results = pool_instances(rows)
    else:
        results = rows = measure(args.pairs[0], args)
    table = summarize(results)
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"rows": results, "instance_rows": rows, "table": table}, indent=1)
                             + "\n")
    return 0


def run_pairs_apart(names: list[str], instances: int, argv: list[str]) -> list[dict]:
    """Each pair ``instances`` times, each time in a child process with these arguments; their rows, in order,
    each tagged with its instance."""
    rows = []
    child = strip_option(strip_option(strip_option(argv, "--pairs"), "--json"), "--instances")
    with tempfile.TemporaryDirectory() as tmp:
        for pair in names:
            for instance in range(instances):
                out = Path(tmp) / f"{pair}-{instance}.json"
                subprocess.run([sys.executable, "-m", "benchmarks.dflash_throughput", *child, "--pairs", pair,
                                "--json", str(out)], check=True)
                rows += [{**row, "instance": instance} for row in json.loads(out.read_text())["rows"]]
    return rows


def pool_instances(rows: list[dict]) -> list[dict]:
    """One row per pair, mode and concurrency: the instances' passes in instance order (so two modes' passes
    still pair up round by round), their median, the fewest requests any ran at once and the gate's steps
    summed. Identical engines built in one process can differ by over a tenth across a whole run (the runs in
    docs/data/dflash_throughput/): pooling fresh instances averages that bias, where more rounds of one instance
    cannot."""
    pooled: dict[tuple, dict] = {}
    for row in rows:
        key = (row["pair"], row["mode"], row["concurrency"])
        cell = pooled.get(key)
        if cell is None:
            pooled[key] = {k: v for k, v in row.items() if k != "instance"} | {
                "tok_per_s_passes": list(row["tok_per_s_passes"]), "instances": 1,
                **({"gate": dict(row["gate"])} if "gate" in row else {})}
            continue
        cell["tok_per_s_passes"] += row["tok_per_s_passes"]
        cell["instances"] += 1
        cell["peak_running"] = min(cell["peak_running"], row["peak_running"])
        for mode, steps in row.get("gate", {}).items():
            cell["gate"][mode] = cell["gate"].get(mode, 0) + steps
    for cell in pooled.values():
        cell["tok_per_s"] = round(statistics.median(cell["tok_per_s_passes"]), 1)
    return list(pooled.values())


def strip_option(argv: list[str], name: str) -> list[str]:
    """``argv`` without option ``name`` and its values."""
    out, skipping = [], False
    for a in argv:
        if a.startswith("--"):
            skipping = a == name or a.startswith(name + "=")
            if skipping:
                continue
        if not skipping:
            out.append(a)
    return out


def measure(pair: str, args) -> list[dict]:
    root = Path(os.environ.get("LUCE_TEST_FIXTURES") or tempfile.mkdtemp(prefix="luce-bench-"))
    results = []
    target, drafter, method = pairs(root)[pair]
    modes = [m for m in MODES if m in args.modes]
    engines = {mode: build(target, drafter, method, mode, max(args.concurrency))
               for mode in BUILD_ORDER if mode in modes}
    for c in args.concurrency:
        prompts = prompts_for(pair, engines["none"], c)
        for llm in engines.values():
            run_pass(llm, prompts, args.tokens // 2)  # warm-up (and gate calibration)
        passes = {mode: [] for mode in modes}
        for order in round_orders(modes, args.repeats):
            for mode in order:
                passes[mode].append(run_measured(engines[mode], prompts, args.tokens))
        for mode in modes:
            llm = engines[mode]
            rates = [generated / wall for wall, generated, _ in passes[mode]]
            row = {"pair": pair, "mode": mode, "concurrency": c, "tokens": passes[mode][0][1],
                   "tok_per_s": round(statistics.median(rates), 1),
                   "tok_per_s_passes": [round(r, 1) for r in rates],
                   "peak_running": min(peak for _, _, peak in passes[mode])}
            sched = llm.llm_engine.engine_core.engine_core.scheduler
            if hasattr(sched, "luce_gate"):
                row["gate"] = dict(sched.luce_gate.decisions)
            results.append(row)
            print(json.dumps(row), flush=True)
    return results


def round_ratios(a: dict, b: dict) -> list[float]:
    """a's throughput over b's, round by round."""
    return [x / y for x, y in zip(a["tok_per_s_passes"], b["tok_per_s_passes"], strict=True)]


def paired(a: dict, b: dict) -> float:
    """Median over rounds of a's throughput over b's in the same round."""
    return statistics.median(round_ratios(a, b))


def against_both_plain(gated: dict, none: dict, control: dict) -> float:
    """Median over rounds of gated's throughput over the mean of the two engines without speculation in the same
    round: each engine carries a bias of its own (up to 13% between identical engines in one process), and a
    baseline of two engines carries about 1/sqrt(2) of one engine's."""
    return statistics.median(g / ((n + c) / 2) for g, n, c in zip(
        gated["tok_per_s_passes"], none["tok_per_s_passes"], control["tok_per_s_passes"], strict=True))


def pair_over_pair(gated: dict, gated2: dict, none: dict, control: dict) -> float:
    """Median over rounds of the two gated engines' throughput over the two plain engines' in the same round."""
    return statistics.median((g + g2) / (n + c) for g, g2, n, c in zip(
        gated["tok_per_s_passes"], gated2["tok_per_s_passes"], none["tok_per_s_passes"],
        control["tok_per_s_passes"], strict=True))


def spread(a: dict, b: dict) -> str:
    """The middle half of the rounds' ratios (quartiles), the noise a median of them carries: on a noisy host
    a cell can miss a goal by less than this."""
    ratios = round_ratios(a, b)
    if len(ratios) < 2:
        return "-"
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return f"{q1:.2f}-{q3:.2f}"


def summarize(rows: list[dict]) -> str:
    """One line per pair and concurrency. The goal column checks gated against no speculation on the least biased
    ratio at hand: both engines of each kind (``pair / pair``), else gated over ``none``."""
    by = {(r["pair"], r["mode"], r["concurrency"]): r for r in rows}
    lines = ["| pair | concurrency | none tok/s | fixed tok/s | gated tok/s | fixed/none | gated/none "
             "| gated/none rounds (quartiles) | control/none (A/A) | gated / both plain | pair / pair | gated/fixed "
             "| goals |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for pair, c in sorted({(r["pair"], r["concurrency"]) for r in rows}):
        none, control, fixed, gated, gated2 = (by.get((pair, m, c)) for m in MODES)
        if None in (none, gated):
            continue
        gated_none = paired(gated, none)
        twins = None if None in (control, gated2) else pair_over_pair(gated, gated2, none, control)
        checked = gated_none if twins is None else twins
        if fixed is None:  # only the first goal can be checked
            fixed_rate = fixed_none = gated_fixed = "-"
            ok, note = checked >= GOAL_VS_NONE, " (no fixed run)"
        else:
            fixed_none, gated_fixed = paired(fixed, none), paired(gated, fixed)
            ok, note = checked >= GOAL_VS_NONE and (fixed_none <= 1.0 or gated_fixed >= GOAL_VS_FIXED), ""
            fixed_rate, fixed_none, gated_fixed = fixed["tok_per_s"], f"{fixed_none:.2f}", f"{gated_fixed:.2f}"
        aa = "-" if control is None else f"{paired(control, none):.2f} ({spread(control, none)})"
        both = "-" if control is None else f"{against_both_plain(gated, none, control):.2f}"
        lines.append(f"| {pair} | {c} | {none['tok_per_s']} | {fixed_rate} | {gated['tok_per_s']} | {fixed_none} | "
                     f"{gated_none:.2f} | {spread(gated, none)} | {aa} | {both} | "
                     f"{'-' if twins is None else f'{twins:.3f}'} | {gated_fixed} | {'met' if ok else 'MISSED'}{note} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
