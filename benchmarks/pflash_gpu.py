"""PFlash through vLLM on one GPU (8B-shaped target, 0.6B-shaped scorer): time to first token vs vLLM's prefill.

In one run: time to first token of long prompts with PFlash and with vLLM's own prefill, and of short requests
that arrive while a long prompt is being scored.

    python -m benchmarks.pflash_gpu --json pflash_gpu.json          # 2 engines, one after another (--budget 540)
    python -m benchmarks.pflash_gpu --tiny --json /tmp/pflash.json  # CPU smoke run: tiny shapes, under a minute

Target: Qwen3-8B's shape as vLLM's dense ``Qwen3ForCausalLM`` (the model of the issue's reference numbers),
config-only with ``load_format="dummy"``; ``--target qwen3_6`` takes the all-full-attention Qwen3.6 of
``kvflash_gpu.py`` instead. Scorer: Qwen3-0.6B's shape (28 layers, hidden 1024, 16/8 heads of 128, MLP 3072,
vocabulary 151,936). PFlash's scorer reads safetensors itself, so the run writes a seeded random-weight checkpoint
once (about 1.2 GB, ``random_qwen3_scorer``); ``--scorer DIR`` uses a real one. Random weights
score like any others for time: the kernels and the kept fraction are the same.

Engines (``--modes``), one after another, each in a child process with vLLM's serve defaults:
* ``vllm``: vLLM alone (``VLLM_PLUGINS=`` empty): FlashAttention prefill of the whole prompt, the baseline;
* ``off``: vllm-luce installed, PFlash off (optional: should match ``vllm``);
* ``pflash``: ``{"luce": {"pflash": {"drafter": SCORER, "keep_ratio": KEEP}}}``;
* ``pflash_early``: the same, scoring with the scorer's first ``--early-exit`` layers only (``early_exit_layers``).

Measured in each engine, every prompt distinct random token ids (no prefix cache hit):
* time to first token (TTFT) of one request at each of ``--contexts``, best of ``--reps``: from the client's
  ``generate`` call to the first streamed token (``max_tokens=1``), so with PFlash it includes the scoring call
  that runs before vLLM adds the request; ``prefilled_tokens`` is what vLLM prefilled (the kept tokens);
* short requests behind a long one: a ``--long``-token prompt is submitted, then after ``--delay`` seconds
  ``--shorts`` prompts of 256 tokens together; each one's TTFT from its own submission, the long one's TTFT, and
  the scoring time PFlash reported for the long one (``vllm:luce_pflash_scoring_seconds``). The scoring pass runs on
  a worker thread of its own while the engine steps, so short requests need not wait for it to end.

The issue's reference figures for vLLM alone (Qwen3-8B's TTFT at 32K and 128K) go into the JSON as
``reference_vllm_h200``. Goal: PFlash
at least 5x faster at 64K. The summary prints the speedup at each context.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from benchmarks import report, vllm_gpu_common as G

MODES = ("pflash", "pflash_early", "vllm", "off")  # in this order: if the budget runs out, the optional engine is the one left out
GOAL_CONTEXT, GOAL_SPEEDUP = 65536, 5.0
SHORT_TOKENS = 256


def random_qwen3_scorer(out: Path, shape: dict, seed: int = 0) -> Path:
    """A ``Qwen3ForCausalLM`` safetensors checkpoint of ``shape`` with seeded random bf16 weights, written once
    (``.seed`` marks a finished one). PFlash's scorer reads safetensors itself (``pflash/scorer.py``), so a dummy
    load does not reach it: Qwen3-0.6B's shape is about 1.2 GB. Matrices have std 1/sqrt(fan_in), norms 1.
    No tokenizer files: the scorer then reads the target's token ids (same vocabulary)."""
    import torch
    from safetensors.torch import save_file

    from vllm_luce.pflash.drafter_spec import DrafterSpec

    key = json.dumps({"shape": shape, "seed": seed}, sort_keys=True)
    if (out / ".seed").is_file() and (out / ".seed").read_text() == key:
        return out
    out.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "max_position_embeddings": 262144,
              "rope_theta": 1e6, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16", **shape}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    spec = DrafterSpec(out, "Qwen3ForCausalLM", shape["vocab_size"], shape["hidden_size"],
                       shape["num_hidden_layers"], shape["num_attention_heads"], shape["num_key_value_heads"],
                       shape["head_dim"], shape["intermediate_size"], 1e6, 1e-6, True, False, {})
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, dims in spec.expected_shapes(shape["num_hidden_layers"]).items():
        if len(dims) == 1:
            tensors[name] = torch.ones(dims, dtype=torch.bfloat16)
        else:
            tensors[name] = (torch.randn(dims, generator=gen) / dims[1] ** 0.5).to(torch.bfloat16)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / ".seed").write_text(key)
    return out


def scoring_seconds() -> float:
    return G.metrics().get("vllm:luce_pflash_scoring_seconds", 0.0)


async def ttft(engine, ids: list[int], request_id: str) -> dict:
    record, scored = {}, scoring_seconds()
    await G.stream(engine, ids, 1, request_id, record)
    return {"ttft_s": round(record["times"][0] - record["submit"], 4), "prefilled_tokens": record["prompt_tokens"],
            "scoring_s": round(scoring_seconds() - scored, 4)}


async def shorts_behind_long(engine, m: dict) -> dict:
    """A long prompt, then ``shorts`` short ones ``delay`` seconds later; every TTFT from its own submission."""
    scored = scoring_seconds()
    long_record, records = {}, [{} for _ in range(m["shorts"])]
    t0 = time.perf_counter()
    long_task = asyncio.create_task(G.stream(engine, G.random_prompt(m["long"], 77), 1, "long", long_record))
    await asyncio.sleep(m["delay"])
    await asyncio.gather(*(G.stream(engine, G.random_prompt(SHORT_TOKENS, 500 + i), 1, f"short-{i}", r)
                           for i, r in enumerate(records)), long_task)
    return {"long_tokens": m["long"], "long_prefilled": long_record["prompt_tokens"],
            "long_ttft_s": round(long_record["times"][0] - long_record["submit"], 4),
            "long_scoring_s": round(scoring_seconds() - scored, 4),
            "short_submit_after_s": [round(r["submit"] - t0, 4) for r in records],
            "short_ttft_s": [round(r["times"][0] - r["submit"], 4) for r in records]}


async def measure(engine, spec: dict, note) -> dict:
    m = spec["measure"]
    await ttft(engine, G.random_prompt(m["warm_up"], 3), "warm-up")  # same for every engine: past PFlash's minimum
    alone = [await ttft(engine, G.random_prompt(SHORT_TOKENS, 900 + i), f"alone-{i}") for i in range(2)]
    rows = []
    for n in m["contexts"]:
        runs = [await ttft(engine, G.random_prompt(n, 10 * n + rep), f"ctx{n}-{rep}") for rep in range(m["reps"])]
        best = min(runs, key=lambda r: r["ttft_s"])
        rows.append({"context": n, **best, "ttft_runs_s": [r["ttft_s"] for r in runs]})
        note(contexts=rows)
        print(f"[{spec['mode']}] {n} tokens: TTFT {best['ttft_s']} s, prefilled {best['prefilled_tokens']}", flush=True)
    behind = await shorts_behind_long(engine, m)
    print(f"[{spec['mode']}] shorts behind a {m['long']}-token prompt: TTFT {behind['short_ttft_s']} s", flush=True)
    return {"contexts": rows, "short_alone_ttft_s": min(r["ttft_s"] for r in alone), "shorts_behind_long": behind,
            "metrics": G.metrics()}


def summarize(results: dict, contexts: list[int]) -> dict:
    def row(mode, n):
        return next((r for r in results.get(mode, {}).get("contexts", []) if r["context"] == n), {})

    out = {}
    for mode, r in results.items():
        behind = r["shorts_behind_long"]
        out[mode] = {"ttft_s": {n: row(mode, n).get("ttft_s") for n in contexts},
                     "kept_fraction": {n: G.ratio(row(mode, n).get("prefilled_tokens"), n, 4) for n in contexts},
                     "short_ttft_alone_s": r["short_alone_ttft_s"],
                     "short_ttft_behind_long_s": max(behind["short_ttft_s"]),
                     "long_scoring_s": behind["long_scoring_s"]}
    for base in ("vllm", "off"):
        for mode in ("pflash", "pflash_early"):
            if base not in results or mode not in results:
                continue
            vs = out[f"{mode}_vs_{base}"] = {
                "ttft_speedup": {n: G.ratio(row(base, n).get("ttft_s"), row(mode, n).get("ttft_s")) for n in contexts},
                "short_behind_long_speedup": G.ratio(out[base]["short_ttft_behind_long_s"],
                                                     out[mode]["short_ttft_behind_long_s"])}
            value = vs["ttft_speedup"].get(GOAL_CONTEXT)
            vs["goal"] = {"context": GOAL_CONTEXT, "value": value, "goal": f">= {GOAL_SPEEDUP}",
                          "met": value is not None and value >= GOAL_SPEEDUP}
    return out


def table(results: dict, contexts: list[int]) -> str:
    lines = ["| engine | " + " | ".join(f"{n:,} TTFT s (prefilled)" for n in contexts)
             + " | short alone s | shorts behind long s | long scoring s |", "|" + " --- |" * (len(contexts) + 4)]
    for mode, r in results.items():
        if "error" in r:
            lines.append(f"| {mode} | failed: {r['error'][:120]} |")
            continue
        cells = [next((f"{c['ttft_s']} ({c['prefilled_tokens']})" for c in r["contexts"] if c["context"] == n), "")
                 for n in contexts]
        b = r["shorts_behind_long"]
        lines.append(f"| {mode} | " + " | ".join(cells) + f" | {r['short_alone_ttft_s']} | {b['short_ttft_s']} | "
                     f"{b['long_scoring_s']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return G.child_main(argv[1:], measure)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and sizes (the CPU smoke run)")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=["pflash", "vllm"])
    ap.add_argument("--target", choices=("qwen3", "qwen3_6"), default="qwen3")
    ap.add_argument("--scorer", type=Path, help="a real scorer checkpoint instead of the random Qwen3-0.6B shape")
    ap.add_argument("--contexts", type=int, nargs="+", help="prompt tokens (default 16K 64K 128K)")
    ap.add_argument("--reps", type=int, default=2, help="TTFT runs per context (best is reported)")
    ap.add_argument("--keep", type=float, default=0.05, help="PFlash keep_ratio")
    ap.add_argument("--early-exit", type=int, default=7, help="the pflash_early engine's early_exit_layers "
                    "(7: a quarter of the 0.6B shape's 28 layers)")
    ap.add_argument("--long", type=int, help="the long prompt that short requests arrive behind (default 65536)")
    ap.add_argument("--shorts", type=int, default=4, help="short requests (256 tokens) behind it")
    ap.add_argument("--delay", type=float, default=0.05, help="seconds between the long prompt and the short ones")
    ap.add_argument("--gpu-share", type=float, default=0.85, help="gpu_memory_utilization")
    ap.add_argument("--timeout", type=float, default=330, help="seconds each engine's child may take")
    ap.add_argument("--budget", type=float, default=540, help="seconds for all engines (a device call has 600)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/luce-bench/pflash"), help="engine logs and specs")
    ap.add_argument("--models", type=Path, default=Path("/tmp/luce-bench/models"),
                    help="checkpoints (the random scorer: 1.2 GB)")
    ap.add_argument("--gpus", type=int, default=1, help="engines side by side, one per card (default: one after another on one card)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    tiny = args.tiny
    contexts = args.contexts or ([384, 768, 1536] if tiny else [16384, 65536, 131072])
    long = args.long or (1536 if tiny else 65536)
    # Tiny prompts need small chunks and few forced ones to leave anything out (the defaults force 32 chunks of 32);
    # the minimum stays above the short requests' 256 tokens, as the default 4096 does.
    pflash = {"keep_ratio": args.keep, **({"min_prompt_tokens": 320, "chunk_tokens": 16, "head_chunks": 1,
                                           "tail_chunks": 2} if tiny else {})}
    warm_up = max(pflash.get("min_prompt_tokens", 4096), 1024 if tiny else 8192)
    max_len = max(*contexts, long, warm_up) + 64
    cuda = G.has_cuda()
    shape = G.TINY_TARGET if tiny else G.QWEN3_8B
    build = G.qwen3_dense if args.target == "qwen3" else G.qwen36_full_attention
    model = build(args.models / f"{args.target}-{'tiny' if tiny else '8b'}", shape, max(max_len, 4096))
    t0 = time.perf_counter()
    scorer = args.scorer or random_qwen3_scorer(args.models / f"scorer-{'tiny' if tiny else '0.6b'}",
                                                  G.TINY_SCORER if tiny else G.QWEN3_06B)
    out = {**G.header(["benchmarks.pflash_gpu", *argv]), "target": args.target, "target_shape": shape,
           "scorer": str(scorer), "scorer_write_s": round(time.perf_counter() - t0, 1), "pflash": pflash,
           "max_model_len": max_len, "settings": {"contexts": contexts, "reps": args.reps, "long": long,
                                                  "shorts": args.shorts, "delay": args.delay, "warm_up": warm_up,
                                                  "gpu_share": args.gpu_share},
           "reference_vllm_h200": {"ttft_s_32k": 1.24, "ttft_s_128k": 11.3}, "results": {}}
    measured = {"contexts": contexts, "reps": args.reps, "long": long, "shorts": args.shorts, "delay": args.delay,
                "warm_up": warm_up}
    def early(mode):
        return {"early_exit_layers": 1 if tiny else args.early_exit} if mode == "pflash_early" else {}

    # vLLM counts Qwen3.6 as hybrid; its hybrid prefix caching fails without Gated DeltaNet layers (kvflash_gpu.py).
    extra = {"enable_prefix_caching": False} if args.target == "qwen3_6" else {}
    specs = {mode: {"mode": mode, "measure": measured, "engine": G.engine_args(
        model, max_len, cuda, kv_bytes=None, gpu_share=args.gpu_share, **extra,
        additional={"luce": {"pflash": {"drafter": str(scorer), **pflash, **early(mode)}}}
        if mode.startswith("pflash") else {})}
        for mode in args.modes}
    ok = G.run_engines("benchmarks.pflash_gpu", specs, out, args, cuda)
    out = {**G.facts_of(out["results"]), **out, "summary": summarize(ok, contexts)}
    report(out, args.json)
    print(table(out["results"], contexts), file=sys.stderr)
    return 0 if len(ok) == len(args.modes) else 1


if __name__ == "__main__":
    from benchmarks.pflash_gpu import main as imported_main  # the workers resolve functions by module name

    raise SystemExit(imported_main())
