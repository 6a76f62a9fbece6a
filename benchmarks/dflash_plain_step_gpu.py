"""GPU: what a plain step (the gate chose K = 0) of gated DFlash costs, against vLLM's per-step context
pass and one target decode step's weight-read floor.

    python3 benchmarks/dflash_plain_step_gpu.py --json dflash_plain_step_gpu.json

vLLM's DFlash proposer runs the drafter's context pass on every step, drafting or not: the committed
tokens' target features through ``fc`` and ``hidden_norm``, then every layer's K/V projection into
the drafter's cache (for K = 0 it also runs the rest of the drafter on one token per request; that
is not counted, so the baseline is a lower bound). vllm-luce's plain step holds the step's features,
positions and slots instead (``dflash_proposer.hold_plain_step``, the code the patch runs), and the
next drafting step, or a full store, writes every held token in one pass (``write_deferred``).

Per plain step of a decode batch of B requests (B committed tokens), on a Qwen3-8B-DFlash shape
(5 target taps of hidden 4096, 5 layers of 8 KV heads of 128, bf16):
* ``per_step_pass_ms``: the context pass of B tokens (the baseline);
* ``hold_ms``: our hold of the step (``store_hold_ms``: the store's copies alone);
* ``deferred_ms``: the held tokens' one pass, with the take that marks the writes to keep, when the
  store is full, over the steps it held (``take_ms``: the take alone, paid once by the drafting step
  or full store that writes them);
* ``gate_us``: the gate core's decision and observation (Python, this host's CPU);
* ``ours_ms``: the plain step under the proposer's rule: a step of ``DIRECT_WRITE_TOKENS`` or more
  writes its context at once (the per-step pass), a smaller one is held. Every row measures holding.

Times are wall clock over a loop with the device synchronized at its end, so host launch costs
count. The pass's RoPE is left out (elementwise), and its cache write is an ``index_copy_`` by slot.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script path
from benchmarks import report  # noqa: E402
from benchmarks.dflash_drafter_latency import HEAD_DIM, HIDDEN, KV_HEADS, LAYERS, TAPS, TARGET_PARAMS  # noqa: E402
from vllm_luce.patches import dflash_proposer as P  # noqa: E402
from vllm_luce.spec_decode.gate import GateConfig, SpecGate  # noqa: E402

BLOCK_SIZE = 16  # vLLM's GPU KV block
CONTEXT = 4096  # each request's position when the measured steps start


class ContextWriter:
    """The drafter's context pass, as ``write_context`` calls it: ``combine_hidden_states`` (fc, then
    hidden_norm) and ``precompute_and_store_context_kv`` (one GEMM for every layer's K/V, into the cache)."""

    def __init__(self, slots: int, device, dtype):
        g = torch.Generator(device=device).manual_seed(0)
        self.fc = (torch.randn(HIDDEN, TAPS * HIDDEN, device=device, generator=g) * 0.02).to(dtype)
        self.norm = torch.ones(HIDDEN, device=device, dtype=dtype)
        self.kv = (torch.randn(LAYERS * 2 * KV_HEADS * HEAD_DIM, HIDDEN, device=device, generator=g) * 0.02).to(dtype)
        self.cache = torch.zeros(slots, LAYERS * 2 * KV_HEADS * HEAD_DIM, device=device, dtype=dtype)

    def combine_hidden_states(self, features: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(features @ self.fc.T, (HIDDEN,), self.norm, 1e-6)

    def precompute_and_store_context_kv(self, states, positions, slots) -> None:
        self.cache.index_copy_(0, slots, states @ self.kv.T)


def steps_for(batch: int, count: int, device, dtype):
    """``count`` decode steps of ``batch`` requests: each step's target taps, positions and slots (request
    r's new tokens in blocks of its own), the block table of those blocks, and the number of slots."""
    blocks_per_request = count // BLOCK_SIZE + 1
    base = torch.arange(batch, device=device) * blocks_per_request * BLOCK_SIZE + BLOCK_SIZE  # block 0: null
    steps = []
    for s in range(count):
        positions = torch.full((batch,), CONTEXT + s, device=device, dtype=torch.int64)
        taps = [torch.randn(batch, HIDDEN, device=device, dtype=dtype) for _ in range(TAPS)]
        steps.append((positions, taps, base + s))
    table = torch.arange(batch * blocks_per_request, device=device, dtype=torch.int32).view(batch, -1) + 1
    return steps, table, batch * blocks_per_request * BLOCK_SIZE + BLOCK_SIZE


def wall_ms(fn, reps: int, sync) -> float:
    for i in range(max(3, reps // 10)):  # warm-up: allocations, library handles, kernel selection
        fn(i)
    sync()
    start = time.perf_counter()
    for i in range(reps):
        fn(i)
    sync()
    return (time.perf_counter() - start) / reps * 1e3


def gate_us(batch: int, steps: int = 20_000) -> float:
    """The gate core's per-step decision and observation in a regime where plain decoding wins."""
    gate = SpecGate(GateConfig())
    start = time.perf_counter()
    for _ in range(steps):
        spec = gate.decide(batch, CONTEXT)
        gate.observe(speculative=spec, batch_size=batch, context_tokens=CONTEXT,
                     committed_tokens=batch * (2 if spec else 1), seconds=0.012 if spec else 0.004)
    return (time.perf_counter() - start) / steps * 1e6


def measure(batch: int, device, dtype, max_tokens: int, reps: int, sync) -> dict:
    proposer = SimpleNamespace(max_num_tokens=max_tokens, block_size=BLOCK_SIZE, num_speculative_tokens=15,
                               _last_draft_probs=None)
    store = P.deferred(proposer)
    rows = store.capacity(torch.empty(0, TAPS * HIDDEN, dtype=dtype))
    held_steps = max(1, rows // batch)  # plain steps the store holds before a full store writes them
    steps, table, slots = steps_for(batch, held_steps, device, dtype)
    proposer.model = ContextWriter(slots, device, dtype)
    cad = [SimpleNamespace(num_actual_tokens=batch, slot_mapping=slot, block_table_tensor=table, num_reqs=batch)
           for _, _, slot in steps]

    def per_step_pass(i):
        positions, taps, slot = steps[i % held_steps]
        P.write_context(proposer, taps, positions, slot)

    def hold(i):
        if i % held_steps == 0:
            store.clear()
        positions, taps, _ = steps[i % held_steps]
        P.hold_plain_step(proposer, positions, taps, cad[i % held_steps])

    def store_hold(i):  # the store's copy alone, without the binding's slicing and checks
        if i % held_steps == 0:
            store.clear()
        positions, taps, slot = steps[i % held_steps]
        store.hold(taps, positions, slot)

    def fill_then_write():
        """The held steps' write, as ``write_deferred`` runs it: the take, then one context pass."""
        for i in range(held_steps):
            hold(i)
        assert store.tokens == held_steps * batch, (store.tokens, held_steps, batch)
        sync()
        start = time.perf_counter()
        held = store.take(table, BLOCK_SIZE)
        sync()
        taken = time.perf_counter()
        P.write_context(proposer, *held)
        sync()
        return taken - start, time.perf_counter() - start

    baseline = wall_ms(per_step_pass, reps, sync)
    ours = wall_ms(hold, max(reps, held_steps), sync)  # holding, at every batch (see main)
    copy_only = wall_ms(store_hold, max(reps, held_steps), sync)
    take_s, write_s = min(fill_then_write() for _ in range(5))
    deferred_ms = write_s / held_steps * 1e3
    return {"batch": batch, "held_steps": held_steps, "per_step_pass_ms": round(baseline, 4),
            "hold_ms": round(ours, 4), "store_hold_ms": round(copy_only, 4), "take_ms": round(take_s * 1e3, 4),
            "deferred_ms": round(deferred_ms, 4),
            "pass_over_hold_and_deferred": round(baseline / (ours + deferred_ms), 2),
            "gate_us": round(gate_us(batch), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--reps", type=int, default=500)
    ap.add_argument("--max-tokens", type=int, default=8192, help="the proposer's max_num_tokens")
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda", help="cpu: a quick check that the script runs (no figures)")
    args = ap.parse_args()
    device, dtype = torch.device(args.device), torch.bfloat16
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    direct = P.DIRECT_WRITE_TOKENS
    P.DIRECT_WRITE_TOKENS = sys.maxsize  # hold at every batch, to show what holding would cost there
    rows = [measure(b, device, dtype, args.max_tokens, args.reps, sync) for b in args.batches]
    for row in rows:  # what a plain step costs under the proposer's rule
        row["written_at_once"] = row["batch"] >= direct
        row["ours_ms"] = round(row["per_step_pass_ms"] if row["written_at_once"] else
                               row["hold_ms"] + row["deferred_ms"], 4)
    result = {"device": str(device), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "rows": rows}
    if device.type == "cuda":
        from benchmarks.gpu_timing import copy_bandwidth, device_info

        bw = copy_bandwidth()
        floor_ms = TARGET_PARAMS * 2 / bw * 1e3
        for row in rows:
            row["ours_over_floor"] = round((row["ours_ms"] + row["gate_us"] / 1e3) / floor_ms, 4)
            row["per_step_pass_over_floor"] = round(row["per_step_pass_ms"] / floor_ms, 4)
        result.update(device_info(), copy_bandwidth_GBps=round(bw / 1e9), target_decode_floor_ms=round(floor_ms, 4))
    return report(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
