"""Shared by the end-to-end GPU benchmarks (``kvflash_gpu.py``, ``pflash_gpu.py``): the run header, config-only
checkpoints, one engine per child process, streamed token timing, and what the workers report.

* Checkpoints are config-only (``config.json`` + the test tokenizer) and engines load them with
  ``load_format="dummy"``: vLLM fills the weights randomly, so an 8B engine starts without a download and time
  per step is that of the real shape. Prompts are token ids and requests ``ignore_eos``, so random logits
  change no length. The test tokenizer (``fixtures/tiny_models.py``) has 1024 ids; sampled ids past it are
  never detokenized (``detokenize=False``).
* Each engine is an ``AsyncLLM`` (the engine client of ``vllm serve``) in a child process of its own
  (``run_child``): plugin registration and ``VLLM_PLUGINS`` apply per process, and a failed engine costs its own
  rows only. vLLM alone is the same child with ``VLLM_PLUGINS=`` (empty).
* Times are taken in the client as each streamed output arrives (``stream``): what a ``vllm serve`` client
  sees, including scoring calls that happen before vLLM adds a request.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fixtures.engine_report import config_facts, registry_metrics

ROOT = Path(__file__).resolve().parents[1]
CPU_ONLY = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND")
TINY_VOCAB = 1024  # the test tokenizer's ids

# Qwen3-8B and Qwen3-0.6B as their Hugging Face configs give them.
QWEN3_8B = {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False}
QWEN3_06B = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True}
# --tiny: shapes the CPU backend runs in seconds (its attention takes head dims 32, 64, 128).
TINY_TARGET = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
               "num_key_value_heads": 1, "head_dim": 64, "vocab_size": TINY_VOCAB, "tie_word_embeddings": False}
TINY_SCORER = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
               "num_key_value_heads": 1, "head_dim": 32, "vocab_size": TINY_VOCAB, "tie_word_embeddings": True}


# ------------------------------------------------------------------ the run header


def git_commit() -> str:
    """``$LUCE_GIT_COMMIT`` (for a copy of the tree without ``.git``), else HEAD with ``+dirty`` when tracked files
    differ from it (read-only git calls)."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""
    head = os.environ.get("LUCE_GIT_COMMIT") or git("rev-parse", "--short=12", "HEAD")
    if not head:
        return "unknown (no .git; set LUCE_GIT_COMMIT)"
    return head + ("+dirty" if "LUCE_GIT_COMMIT" not in os.environ and git("status", "--porcelain", "-uno") else "")


def header(argv: list[str]) -> dict:
    """Date, commit, command line and host; each engine's child adds its device and versions (``engine_facts``)."""
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "git_commit": git_commit(),
            "command": " ".join([Path(sys.executable).name, "-m", *argv]), "host": platform.node()}


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# ------------------------------------------------------------------ config-only checkpoints


def _tokenizer_dir(root: Path) -> Path:
    from fixtures.tiny_models import build_tokenizer

    return build_tokenizer(root)


def _write_json(path: Path, body: dict) -> None:
    path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")


def qwen3_dense(out: Path, shape: dict, max_len: int) -> Path:
    """Config-only ``Qwen3ForCausalLM`` (vLLM's own dense class, as Qwen3-8B is served) of ``shape``."""
    from transformers import Qwen3Config

    from fixtures.tiny_models import copy_tokenizer, write_generation_config

    out.mkdir(parents=True, exist_ok=True)
    config = json.loads(Qwen3Config(**shape, max_position_embeddings=max_len, bos_token_id=0, eos_token_id=2,
                                    pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                    ).to_json_string())
    config.pop("transformers_version", None)
    _write_json(out / "config.json", {**config, "architectures": ["Qwen3ForCausalLM"], "dtype": "bfloat16"})
    copy_tokenizer(_tokenizer_dir(out.parent), out)
    write_generation_config(out)
    return out


def qwen36_full_attention(out: Path, shape: dict, max_len: int) -> Path:
    """Config-only Qwen3.6 as vLLM 0.26 serves it (``Qwen3_5ForConditionalGeneration``, the layout of
    ``fixtures/conditional.py``) with every layer ``full_attention``: Qwen3.6's gated attention
    (q_proj also makes the output gate), partial RoPE 0.25 and M-RoPE, at ``shape``. KVFlash attaches to this
    family, not to vLLM's ``Qwen3ForCausalLM``. vLLM counts the family as hybrid whatever the layer types, and
    sizes attention blocks to hold one Gated DeltaNet state: the unused ``linear_*`` sizes are the smallest, so
    blocks keep the attention backend's size."""
    from fixtures import conditional as C

    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer_dir(out.parent)
    tokenizer_json, token_ids = C._tokenizer_with_vision_tokens(tok)
    text = {**shape, "layer_types": ["full_attention"] * shape["num_hidden_layers"], "max_position_embeddings": max_len,
            "linear_num_key_heads": 1, "linear_num_value_heads": 1, "linear_key_head_dim": 32,
            "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
            "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0}
    _write_json(out / "config.json", C.conditional_config(text, token_ids))
    for name, body in C._processor_configs(C.VISION_CONFIG).items():
        _write_json(out / name, body)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        (out / name).write_bytes((tok / name).read_bytes())
    (out / "tokenizer.json").write_text(tokenizer_json)
    return out


def random_prompt(n: int, seed: int) -> list[int]:
    """``n`` token ids in [10, 1000): inside the test tokenizer, past its special ids."""
    import random

    rng = random.Random(seed)
    return [rng.randrange(10, 1000) for _ in range(n)]


# ------------------------------------------------------------------ engines in child processes


def child_env(plugins: bool, cuda: bool, gpu: int | None = None) -> dict:
    """``gpu``: the child sees only that card (an index into the parent's CUDA_VISIBLE_DEVICES, if set)."""
    env = {k: v for k, v in os.environ.items() if not (cuda and k in CPU_ONLY)}
    if gpu is not None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[gpu] if visible else str(gpu)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc sends this module's functions to the workers
    env["TOKENIZERS_PARALLELISM"] = "false"
    if not cuda:  # AsyncLLM still runs its engine core in a process of its own; the worker then runs in it
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if not plugins:
        env["VLLM_PLUGINS"] = ""
    return env


def root_cause(log: str) -> str:
    """The last exception line of a child's log that is not vLLM's engine-died wrapper."""
    wrappers = ("EngineDeadError", "Engine core initialization failed", "EngineCore encountered")
    causes = [m.group(0) for line in log.splitlines()
              if (m := re.search(r"\b\w+(Error|Exception): .*", line)) and not any(w in line for w in wrappers)]
    return causes[-1][:400] if causes else "no exception in the log"


def run_child(module: str, spec: dict, workdir: Path, name: str, *, plugins: bool, cuda: bool,
              timeout: float, gpu: int | None = None) -> dict:
    """Run ``python -m module --child SPEC OUT`` in a process group of its own; its report, or ``{"error": ...}``
    with what it had measured (``partial``) and its log's tail (the log stays in ``workdir``): one failed engine
    leaves the others' results. Past ``timeout`` the whole group is killed (vLLM's engine core and workers too, so
    the GPU memory is free for the next engine)."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, out_path, log_path = (workdir / f"{name}{s}" for s in (".spec.json", ".out.json", ".log"))
    partial = out_path.with_suffix(".partial")
    spec_path.write_text(json.dumps(spec))
    for stale in (out_path, partial):
        stale.unlink(missing_ok=True)
    print(f"{name}: engine starting (limit {timeout:.0f} s)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", module, "--child", str(spec_path), str(out_path)], cwd=ROOT,
                                env=child_env(plugins, cuda, gpu), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            code = "timeout"
        _kill_group(proc)
    wall = round(time.perf_counter() - t0, 1)
    print(f"{name}: done in {wall} s (exit {code})", file=sys.stderr, flush=True)
    if code == 0 and out_path.is_file():
        return {**json.loads(out_path.read_text()), "child_wall_s": wall}
    text = log_path.read_text(errors="replace")
    print(f"{name}: engine failed: {root_cause(text)}; log {log_path}", file=sys.stderr, flush=True)
    return {"error": f"exit {code}: {root_cause(text)}", "child_wall_s": wall, "log_tail": text[-3000:],
            "partial": json.loads(partial.read_text()) if partial.is_file() else None}


def _kill_group(proc) -> None:
    import signal

    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            time.sleep(1 if sig == signal.SIGTERM else 0)  # the group's other processes
        except subprocess.TimeoutExpired:
            pass


def child_main(argv: list[str], measure) -> int:
    """In the child: start the engine of ``spec["engine"]``, ``await measure(engine, spec, note)``, write the
    report. ``note(**items)`` keeps what is measured so far in ``OUT.partial``, for a run cut short."""
    spec_path, out_path = argv
    spec = json.loads(Path(spec_path).read_text())
    found: dict = {}

    def note(**items) -> None:
        found.update(items)
        Path(out_path).with_suffix(".partial").write_text(json.dumps(found))

    report = asyncio.run(_child(spec, measure, note))
    Path(out_path).write_text(json.dumps(report))
    return 0


async def _child(spec: dict, measure, note) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    t0 = time.perf_counter()
    # vllm serve's defaults for the token budget and sequences (OPENAI_API_SERVER), not the offline LLM's.
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**spec["engine"]), usage_context=UsageContext.OPENAI_API_SERVER)
    try:
        facts = {"engine_start_s": round(time.perf_counter() - t0, 1), **await engine_facts(engine)}
        note(**facts)
        return {**facts, **await measure(engine, spec, note)}
    finally:
        engine.shutdown()


def engine_args(model: Path, max_len: int, cuda: bool, *, kv_bytes: int | None, gpu_share: float,
                additional: dict | None = None, **extra) -> dict:
    """``AsyncEngineArgs`` keywords: dummy weights, bf16, the KV cache given in bytes (``kv_bytes``) or as
    vLLM's share of the card (``gpu_share``, vLLM profiles the rest); everything else vLLM's default on a GPU
    (CUDA graphs, torch.compile, asynchronous scheduling, the model runner vLLM picks)."""
    args = {"model": str(model), "load_format": "dummy", "dtype": "bfloat16", "max_model_len": max_len, "seed": 0,
            "disable_log_stats": False, "additional_config": additional or {}, **extra}
    if (model / "preprocessor_config.json").is_file():  # Qwen3.6: text only (vLLM skips the vision tower)
        args["limit_mm_per_prompt"] = {"image": 0, "video": 0}
        if cuda:  # vLLM's own key, as the GPU tier sets it: the gpu-vllm kit has no FlashInfer
            args["additional_config"] = {"gdn_prefill_backend": "triton", **args["additional_config"]}
    if cuda:
        args.update(gpu_memory_utilization=gpu_share, **({"kv_cache_memory_bytes": kv_bytes} if kv_bytes else {}))
    else:  # eager, as the CPU tests run
        args["enforce_eager"] = True
    return args


# ------------------------------------------------------------------ timing


def params(max_tokens: int):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False,
                          output_kind=RequestOutputKind.DELTA)


async def stream(engine, ids: list[int], max_tokens: int, request_id: str, record: dict) -> dict:
    """Generate and fill ``record``: ``submit`` (perf_counter), ``times`` (one per token, the arrival of the
    output that carried it), ``prompt_tokens`` (what vLLM prefilled: fewer when PFlash compressed it)."""
    record.update(submit=time.perf_counter(), times=[], prompt_tokens=None)
    async for out in engine.generate({"prompt_token_ids": ids}, params(max_tokens), request_id):
        now = time.perf_counter()
        record["prompt_tokens"] = len(out.prompt_token_ids or []) or record["prompt_tokens"]
        record["times"].extend([now] * len(out.outputs[0].token_ids))
    return record


# ------------------------------------------------------------------ what the engine and its workers report


async def engine_facts(engine) -> dict:
    import torch
    import vllm

    device = ({"device": torch.cuda.get_device_name(), "torch": torch.__version__} if torch.cuda.is_available()
              else {"device": f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
                    "torch": torch.__version__})
    config = engine.vllm_config
    worker = (await engine.collective_rpc(_worker_facts))[0]
    return {**device, "vllm": vllm.__version__, "plugins": os.environ.get("VLLM_PLUGINS", "(all)"),
            **config_facts(config, ("max_num_batched_tokens", "max_num_seqs", "async_scheduling", "enforce_eager",
                                    "prefix_caching")), **worker}


def _worker_facts(worker) -> dict:
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    return {"model_class": type(model).__qualname__,
            "model_runner": f"{type(runner).__module__}.{type(runner).__name__}",
            "cudagraph_mode": str(runner.vllm_config.compilation_config.cudagraph_mode)}


def metrics() -> dict:
    """vLLM's scheduler gauges and every ``vllm:luce_*`` value in this process's Prometheus registry, summed over
    labels other than ``outcome`` (``fixtures.engine_report.registry_metrics``)."""
    return registry_metrics()


def run_engines(module: str, specs: dict, out: dict, args, cuda: bool) -> dict:
    """Each engine of ``specs`` (mode -> spec), vLLM alone for mode ``vllm``, within ``args.budget`` seconds overall
    (an engine gets at most ``args.timeout`` and what the budget has left; none is started with less than two minutes
    left: an 8B engine takes 1-2 minutes to start); ``out`` is written to ``args.json`` after each, so a run cut
    short keeps what it measured. With ``args.gpus`` > 1, up to that many engines at once, each on a card of its
    own (the machine's cards are alike; the engines never share one); otherwise one after another."""
    deadline = time.perf_counter() + args.budget
    gpus = getattr(args, "gpus", 1) if cuda else 1
    free = list(range(gpus))[::-1]
    lock = threading.Lock()

    def one(mode, spec):
        left = min(args.timeout, deadline - time.perf_counter())
        if left < 120:
            return {"error": f"not started: {left:.0f} s of the --budget left"}
        with lock:
            gpu = free.pop() if gpus > 1 else None
        try:
            return run_child(module, spec, args.workdir, mode, plugins=mode != "vllm", cuda=cuda, timeout=left, gpu=gpu)
        finally:
            if gpu is not None:
                with lock:
                    free.append(gpu)

    def record(mode, result):
        out["results"][mode] = result
        if args.json:
            with lock:
                Path(args.json).write_text(json.dumps(out, indent=1) + "\n")

    if gpus > 1:
        with ThreadPoolExecutor(max_workers=gpus) as pool:
            futures = {mode: pool.submit(one, mode, spec) for mode, spec in specs.items()}
            for mode, future in futures.items():
                record(mode, future.result())
    else:
        for mode, spec in specs.items():
            record(mode, one(mode, spec))
    return {m: r for m, r in out["results"].items() if "error" not in r}


def facts_of(results: dict) -> dict:
    """Device and versions, from the first engine that ran (each child reports its own)."""
    first = next((r for r in results.values() if "error" not in r), {})
    return {k: first.get(k) for k in ("device", "vllm", "torch")}


def ratio(a, b, digits: int = 2):
    return round(a / b, digits) if a and b else None
