"""The GPU tier: every feature through real vLLM on a CUDA GPU with vLLM's GPU defaults (CUDA graphs,
asynchronous scheduling where vLLM turns it on, the model runner vLLM picks). Skipped without CUDA, so
never run by CI; `docs/gpu.md` says how to run it on a GPU machine and holds its latest results.

Each engine runs in a subprocess (``tests/gpu/engine.py`` or ``vllm serve``) so that plugin registration,
VLLM_PLUGINS and VLLM_USE_V2_MODEL_RUNNER apply per engine. Engines take a small share of the GPU each,
so pytest-xdist can run several at once: each gets a fixed KV cache (``kv_cache_memory_bytes``, which
skips vLLM's free-memory profiling that other engines would upset); everything else is vLLM's default.
``LUCE_GPU_TP`` (default 1) sets the tensor parallel size.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TP = int(os.environ.get("LUCE_GPU_TP", "1"))
# Each engine gets a fixed KV cache: engines that share the card cannot profile its free memory.
KV_CACHE_BYTES = int(float(os.environ.get("LUCE_GPU_KV_GIB", "4")) * 2**30)
# vLLM still checks at startup that this share of the card is free; engines beside each other hold some.
GPU_SHARE = float(os.environ.get("LUCE_GPU_SHARE", "0.3"))
CPU_ONLY = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="GPU tier: needs CUDA (docs/gpu.md)")
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(skip)


_ENGINES = itertools.count()  # engines this pytest process started


def gpu_env(plugins: bool = True, **overrides: str) -> dict:
    """The environment of a GPU engine: the caller's, less the CPU tier's settings; ``plugins=False``
    starts vLLM without vllm-luce (VLLM_PLUGINS empty)."""
    env = {k: v for k, v in os.environ.items() if k not in CPU_ONLY}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    devices = int(os.environ.get("LUCE_GPU_DEVICES", "1"))
    if TP == 1 and devices > 1:  # single-GPU engines spread over the machine's cards by pytest worker
        env["CUDA_VISIBLE_DEVICES"] = str(int(worker[2:]) % devices)
    env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # LLM.apply_model sends a function to the workers
    # Each engine's ports (vLLM scans up from VLLM_PORT) in a range of its own: two TP=2 engines started at once
    # can draw the same free port from the OS, and one then fails with EADDRINUSE. Two tier runs of one TP side by
    # side take separate bases (LUCE_GPU_PORT_BASE).
    base = int(os.environ.get("LUCE_GPU_PORT_BASE", "20000"))
    env.setdefault("VLLM_PORT", str(base + 4000 * (TP - 1) + 400 * int(worker[2:]) + 40 * (next(_ENGINES) % 10)))
    if not plugins:
        env["VLLM_PLUGINS"] = ""
    env.update(overrides)
    return env


# vLLM's own setting: its Triton Gated DeltaNet prefill. On Hopper vLLM defaults to FlashInfer's, which the
# gpu-vllm kit does not carry (vLLM alone fails the same way without it).
VLLM_ADDITIONAL = {"gdn_prefill_backend": "triton"}


def llm_args(additional_config: dict | None = None, **extra) -> dict:
    return {"kv_cache_memory_bytes": KV_CACHE_BYTES, "gpu_memory_utilization": GPU_SHARE, "tensor_parallel_size": TP,
            "seed": 0,
            "additional_config": {**VLLM_ADDITIONAL, **(additional_config or {})}, **extra}


RUNNERS = {"v1": {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "v2": {"VLLM_USE_V2_MODEL_RUNNER": "1"}}


def run_engine(spec: dict, workdir: Path, *, plugins: bool = True, timeout: float = 900, name: str | None = None,
               **env) -> dict:
    """Run ``tests/gpu/engine.py`` on ``spec``; the engine's report, or a failure with its log's tail.
    ``name`` (default ``engine-N``, in start order) names its files; engines run side by side need one each."""
    workdir.mkdir(parents=True, exist_ok=True)
    name = name or f"engine-{len(list(workdir.glob('engine-*.log')))}"
    spec_path, out_path, log_path = (workdir / f"{name}{s}" for s in (".json", ".out.json", ".log"))
    spec_path.write_text(json.dumps(spec))
    with open(log_path, "w") as log:
        proc = subprocess.run([sys.executable, "-m", "tests.gpu.engine", str(spec_path), str(out_path)], cwd=ROOT,
                              env=gpu_env(plugins, **env), stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    keep_log(log_path)
    if proc.returncode != 0:
        log = log_path.read_text(errors="replace")
        raise AssertionError(f"engine exited {proc.returncode}: {root_cause(log)}\n{log[-6000:]}")
    return json.loads(out_path.read_text())


def root_cause(log: str) -> str:
    """The last exception line of an engine's log that is not vLLM's engine-died wrapper."""
    wrappers = ("EngineDeadError", "Engine core initialization failed", "EngineCore encountered")
    causes = [found.group(0) for line in log.splitlines()
              if (found := re.search(r"\b\w+(Error|Exception): .*", line)) and not any(w in line for w in wrappers)]
    return causes[-1][:400] if causes else "?"


def run_alone_or_skip(spec: dict, workdir: Path, runner: str, name: str | None = None, **env) -> dict:
    """vLLM alone on ``runner`` ("v1" or "v2"); the test is skipped, naming vLLM's reason, where vLLM itself
    does not run this model or feature on that runner."""
    try:
        return run_engine(spec, workdir, plugins=False, name=name, **RUNNERS[runner], **env)
    except AssertionError as failure:
        pytest.skip(f"vLLM alone does not run this on {runner}: {str(failure).splitlines()[0][:300]}")


def keep_log(path: Path) -> None:
    """Copy an engine's log under $LUCE_GPU_LOGS (the run's results), named after the test."""
    logs = os.environ.get("LUCE_GPU_LOGS")
    if logs:
        test = os.environ.get("PYTEST_CURRENT_TEST", "unknown").split(" ")[0].replace("/", "_").replace("::", "-")
        Path(logs).mkdir(parents=True, exist_ok=True)
        (Path(logs) / f"{test}-{path.name}").write_text(path.read_text(errors="replace"))


def drift_and_ties(graphs: dict, graphless: dict, upto: list | None = None) -> tuple[float, list[float]]:
    """Two runs of the same prompts: the largest difference of a sampled token's logprob while their tokens agree,
    and, for each request whose tokens part, the smaller top-2 gap of the two runs where they part. ``upto`` (per
    request, a position or None) compares each request only before that position."""
    drift, gaps = 0.0, []
    for n, (a, b, la, lb) in enumerate(zip(graphs["tokens"], graphless["tokens"], graphs["logprobs"],
                                           graphless["logprobs"])):
        end = len(a) if upto is None or upto[n] is None else min(len(a), upto[n])
        part = next((i for i, (x, y) in enumerate(zip(a[:end], b[:end])) if x != y), None)
        agreed = end if part is None else part
        drift = max([drift] + [abs(la[i][0] - lb[i][0]) for i in range(agreed)])
        if part is not None:
            gaps.append(min(la[part][1] - la[part][2], lb[part][1] - lb[part][2]))
    return drift, gaps


# Two engines compiled apart (with and without vllm-luce) round bf16 differently: where a random model's two best
# tokens are this close, greedy decoding may take either. vLLM's own model tests allow the same
# (check_logprobs_close: each run's token among the other's top logprobs where they part).
TIE_GAP = 0.05


def first_parts(a: list[list[int]], b: list[list[int]]) -> list[int | None]:
    """Per request, the first output position where two runs' tokens differ (None where they never do)."""
    return [next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None) for ta, tb in zip(a, b)]


def parts(a: dict, b: dict) -> list[dict]:
    """Each request whose greedy tokens part between two runs (with ``logprobs`` >= 2): where, each run's top-2
    logprob gap there, and whether it is a tie: each run's token the other's second, both gaps at most TIE_GAP."""
    found = []
    for req, i in enumerate(first_parts(a["tokens"], b["tokens"])):
        if i is None:
            continue
        ta, tb = a["tokens"][req], b["tokens"][req]
        gaps = [run["logprobs"][req][i][1] - run["logprobs"][req][i][2] for run in (a, b)]
        tie = ta[i] in b["top_ids"][req][i][:2] and tb[i] in a["top_ids"][req][i][:2] and max(gaps) <= TIE_GAP
        found.append({"request": req, "position": i, "gaps": gaps, "tie": tie})
    return found


def keep_report(name: str, report: dict) -> None:
    """A test's figures as ``$LUCE_GPU_LOGS/<name>.json`` (in the tier's logs.tgz, even when the call's limit cuts
    pytest's own report short)."""
    logs = os.environ.get("LUCE_GPU_LOGS")
    if logs:
        Path(logs).mkdir(parents=True, exist_ok=True)
        (Path(logs) / f"{name}.json").write_text(json.dumps(report, indent=1))


@pytest.fixture(scope="session")
def trained_hybrid(fixtures_root) -> Path:
    """The trained Qwen3.6-architecture target as real Qwen3.6 checkpoints are: Qwen3_5ForConditionalGeneration
    (vLLM 0.26 serves no text-only Qwen3_5ForCausalLM), with its DFlash drafter as the sibling
    ``<target>-DFlash`` that ``--speculative-model dflash`` finds."""
    from fixtures.conditional import as_conditional_generation
    from fixtures.trained import trained_model

    models = fixtures_root / "gpu-models"
    target = as_conditional_generation(trained_model("qwen36-target"), models / "qwen36")
    drafter = models / "qwen36-DFlash"
    if not drafter.exists():
        drafter.symlink_to(trained_model("qwen36-dflash"), target_is_directory=True)
    return target


def side_by_side(*calls):
    """Run engines at once (each ``(function, args, kwargs)``, with its own ``name``) and return their reports in
    order: a hybrid engine takes minutes to start at TP=2, and engines started together wait out one start
    between them. A skip or failure of any one is raised after all have ended."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(f, *args, **kwargs) for f, args, kwargs in calls]
    return [f.result() for f in futures]
