"""`vllm-luce check`: a configuration validated and resolved as `vllm serve` would, without starting vLLM.

Reads the model's config.json (never its weights; a model id is looked up in the Hugging Face cache, never
downloaded) and runs the checks the server runs before any weights load, through the same functions: the
settings (``config.py``), the vLLM version (``compat.py``), DFlash's drafter (``spec_decode/resolve.py``),
KVFlash's policy, architecture and pool (``kvflash/install.py: check_kvflash``), PFlash's drafter
(``pflash/install.py``). Then it prints every value those settings resolve to. A chunk's bytes come from the KV
cache spec the engine builds, so the host figures that depend on them are estimated from config.json and say so;
what only the running engine knows (free GPU memory, the runner) is printed as the rule that resolves it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from vllm_luce.compat import UnsupportedVllmVersion
from vllm_luce.config import LuceConfig
from vllm_luce.spec_decode import resolve as R

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
# What a failed check raises, each message naming the flag, setting, variable or file and what was expected:
# LuceConfigError, the drafters' errors but DrafterNotFound (an OSError), a bad VLLM_LUCE_EXECUTORS and CheckError
# are ValueErrors.
CHECK_ERRORS = (ValueError, OSError, UnsupportedVllmVersion)


class CheckError(ValueError):
    pass


def installed_vllm_version() -> str | None:
    """The installed vLLM's version from its package metadata (importing vLLM takes seconds); None without vLLM."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def check_environment() -> None:
    """Raise for a `VLLM_LUCE_*` variable that stops every vLLM process at plugin registration (``register()``):
    an unknown name or a bad value of a setting, or a bad ``VLLM_LUCE_EXECUTORS``."""
    from vllm_luce.architectures import executors_mode

    LuceConfig.from_sources()
    executors_mode()


def read_model_config(model: str) -> tuple[str, dict]:
    """(where config.json was read, its contents): MODEL/config.json, or the Hugging Face cache's copy for an id."""
    local = Path(model).expanduser()
    if local.is_dir():
        found: Any = local / "config.json"
        if not found.is_file():
            raise CheckError(f"MODEL {model}: no config.json in this directory; expected a Hugging Face model "
                             "directory")
    else:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json")
        if not isinstance(found, str):
            raise CheckError(f"MODEL {model}: not a local directory and not in the Hugging Face cache; expected a "
                             "model directory or a downloaded model id (check never downloads)")
    try:
        return str(found), json.loads(Path(found).read_text())
    except ValueError as e:
        raise CheckError(f"MODEL {model}: {found} is not valid JSON ({e})") from None


def text_config(config: dict) -> dict:
    """The language model's part of a multimodal config (vLLM's ``hf_text_config``), else the config itself."""
    return config.get("text_config") or config


def size(nbytes: int) -> str:
    """``786432`` -> ``768.0 KiB (786432 bytes)``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit} ({nbytes} bytes)"
    return f"{nbytes} bytes"


def chunk_bytes_estimate(text: dict, chunk_tokens: int, tensor_parallel: int) -> tuple[int, str]:
    """One chunk's K and V over the full-attention layers that own their KV, on one worker, from config.json
    (the engine reads the same from its KV cache spec: ``engine_tiers.chunk_bytes_per_rank``)."""
    layers = int(text["num_hidden_layers"])
    kinds = text.get("layer_types") or ["full_attention"] * layers
    owning = kinds[:layers - int(text.get("num_kv_shared_layers") or 0)]
    full = sum(kind == "full_attention" for kind in owning)
    heads = int(text.get("num_attention_heads") or 1)
    kv_heads = int(text.get("num_global_key_value_heads") or text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("global_head_dim") or text.get("head_dim") or int(text["hidden_size"]) // heads)
    worker_heads = max(1, kv_heads // tensor_parallel)
    dtype = str(text.get("dtype") or text.get("torch_dtype") or "bfloat16")
    nbytes = full * chunk_tokens * worker_heads * 2 * head_dim * DTYPE_BYTES.get(dtype, 2)
    return nbytes, (f"{full} full-attention layers x {chunk_tokens} tokens x {worker_heads} KV heads per worker x "
                    f"K and V of {head_dim} x {dtype}")


def dflash_lines(luce: LuceConfig, spec_model: str | None, spec_tokens: int | None, target: str,
                 text: dict) -> tuple[list[str], int]:
    """DFlash's resolved values and the draft tokens per step (0 without speculation), as the EngineArgs patch
    resolves them (``patches/engine_args.py: apply_dflash_defaults``), nothing converted or downloaded."""
    if spec_model is None:
        return ["dflash: off (no --speculative-model)"], 0
    resolved = R.resolve_drafter(spec_model, target)
    lines = [f"dflash: drafter {resolved.path} ({resolved.source})"]
    if resolved.path.endswith(".gguf"):
        if not Path(resolved.path).is_file():
            raise R.DrafterNotFound(f"--speculative-model {resolved.path}: no such GGUF file")
        lines.append("  GGUF: converted once at startup into ~/.cache/vllm-luce/drafters/ (or $XDG_CACHE_HOME's); "
                     "its config is checked against the target then")
        tokens = spec_tokens or 0
        drafter_config = None
    else:
        drafter_config = R.load_drafter_config(resolved.path)
        if drafter_config is None:
            lines.append("  not on disk: vLLM downloads it at startup, where DFlash is used if its config.json names "
                         f"{R.DFLASH_ARCHITECTURE}")
            return lines, spec_tokens or 0
        if R.DFLASH_ARCHITECTURE not in (drafter_config.get("architectures") or []):
            return [f"dflash: off (drafter {resolved.path} is no DFlash drafter: vLLM's own speculation)"], \
                spec_tokens or 0
        block = R.default_num_speculative_tokens(drafter_config, resolved.path)
        R.check_drafter_matches_target(drafter_config, text, resolved.path, target)
        R.check_drafter_weights(resolved.path, "--speculative-model")
        tokens = spec_tokens or block
    lines.append("  draft tokens per step: " + (f"{tokens} (--spec-tokens)" if spec_tokens else
                                                 f"{tokens} (the drafter's block size - 1)" if tokens else
                                                 "the drafter's block size - 1 (read at startup)"))
    lines.append("  max_num_seqs: vLLM's default, unless it leaves no room for the draft slots of every running "
                 "request in a step's token budget: then the largest power of two that does (logged at startup)")
    d = luce.dflash
    gate = d.on_when_used() and d.gate  # as spec_decode/install.py: install_gate decides
    lines.append(f"  gate: {'on' if gate else 'off'}; verify_confidence {d.verify_confidence}, min_verify_tokens "
                 f"{d.min_verify_tokens}, plain_context_stash {d.plain_context_stash}"
                 + (" (1024 tokens on vLLM 0.26 with Model Runner V2 on CUDA, 0 elsewhere)"
                    if d.plain_context_stash == "auto" else ""))
    return lines, tokens


def recorded_budget(path: str) -> int | None:
    """The budget an existing host ledger file records (in force while a server that uses it runs), read only."""
    from vllm_luce.kvflash.host_ledger import HEADER, MAGIC

    try:
        with open(path, "rb") as f:
            magic, budget = HEADER.unpack(f.read(HEADER.size))
    except (OSError, struct.error):  # no file, or too short for a ledger: nothing recorded
        return None
    return budget if magic == MAGIC else None


def kvflash_lines(luce: LuceConfig, architectures: list[str], text: dict, max_model_len: int,
                  tensor_parallel: int, lookahead: int) -> list[str]:
    from vllm_luce.kvflash.admission import AdmissionConfig
    from vllm_luce.kvflash.host_ledger import auto_budget, sharing_unknown
    from vllm_luce.kvflash.install import check_kvflash
    from vllm_luce.kvflash.settings import (ledger_path, longest_page_out, resolve_pinned_bytes,
                                            resolve_request_bytes)

    kv = luce.kvflash
    if not kv.enabled:
        return ["kvflash: off"]
    speculative = SimpleNamespace(num_speculative_tokens=lookahead) if lookahead else None
    plan = check_kvflash(SimpleNamespace(model_config=SimpleNamespace(architectures=architectures),
                                         speculative_config=speculative), luce)
    cfg = plan.pager
    lines = [f"kvflash: on, selection {kv.selection}, policy {kv.policy}, query_window {kv.query_window}",
             f"  pool_tokens: {cfg.pool_tokens}{' (auto)' if 'pool_tokens' in kv.auto else ''}: {cfg.pool_chunks} "
             f"chunks of {cfg.chunk_tokens} tokens, {cfg.sink_chunks} sink and {cfg.recent_tail_chunks} recent chunks "
             "always resident",
             "  prefix caching: off (a pooled request's KV is not a function of its prefix)"]
    if plan.sfi:
        return lines + ["  SFI: every block stays resident; decode attends to the pool, no host memory is used"]
    lines.append(f"  step budget: at most {cfg.max_step_tokens} tokens a step (the scheduler's token budget and "
                 "long_prefill_token_threshold are capped to it)")
    lines.append(f"  a paged prompt prefills in steps of at most {cfg.epoch_tokens} tokens, and a paged request's "
                 "steps end where KVFlash decides (docs/kvflash.md)")
    worker_chunk, shape = chunk_bytes_estimate(text, cfg.chunk_tokens, tensor_parallel)
    engine_chunk = tensor_parallel * worker_chunk
    lines.append(f"  one chunk: about {size(worker_chunk)} on each of the {tensor_parallel} workers ({shape}; "
                 "estimated from config.json, the engine logs the exact value)")
    path = ledger_path(kv.host_ledger)
    if kv.host_bytes == "auto":
        budget = auto_budget()
        part = "a quarter of the memory available now (a container with no memory limit: other containers may " \
            "count the same memory)" if sharing_unknown() else "half of the memory available now"
        lines.append(f"  host_bytes: auto: {size(budget)}, {part} (set when the first server on the host ledger "
                     "starts)")
    else:
        budget = int(kv.host_bytes)
        lines.append(f"  host_bytes: {size(budget)}")
    lines.append(f"  host_ledger: {path} (every server that uses this file shares host_bytes)")
    recorded = recorded_budget(path)
    if recorded is not None and recorded != budget:
        lines.append(f"    the file records a budget of {size(recorded)}: while a server that uses it runs, that "
                     "budget stays in force"
                     + ("" if kv.host_bytes == "auto" else " and this host_bytes stops startup"))
    longest = longest_page_out(max_model_len, cfg.pool_tokens, cfg.chunk_tokens, engine_chunk)
    request = resolve_request_bytes(kv.host_request_bytes, budget, longest)
    longest_context = AdmissionConfig(chunk_tokens=cfg.chunk_tokens, pool_chunks=cfg.pool_chunks,
                                      block_size=cfg.chunk_tokens, chunk_bytes=engine_chunk,
                                      request_bytes=request).max_tokens(lookahead)
    lines.append(f"  host_request_bytes: {kv.host_request_bytes}: about {size(request)} per request, split between "
                 "the n samples of one ("
                 + ("max_model_len fits" if longest_context >= max_model_len else
                    f"a prompt beyond about {longest_context} tokens is refused") + ")")
    pinned = resolve_pinned_bytes(kv.host_pinned_bytes, budget, worker_chunk, max_model_len, cfg.pool_tokens,
                                  cfg.chunk_tokens) // worker_chunk * worker_chunk
    pinned = min(pinned, max(0, budget - request) // tensor_parallel // worker_chunk * worker_chunk)
    lines.append(f"  host_pinned_bytes: {kv.host_pinned_bytes}: about {size(pinned)} pinned by each worker at "
                 "startup, within what the host ledger leaves less one request's share (GPU only)")
    lines.append(f"  host_full: {kv.host_full}; gpu_cold: "
                 + ("on (cold chunks go to free KV blocks first, a tenth of the cache kept free)" if kv.gpu_cold
                    else "off (cold chunks go to host memory)"))
    return lines


def pflash_lines(luce: LuceConfig, text: dict) -> list[str]:
    from vllm_luce.pflash.install import install_pflash

    pf = luce.pflash
    if not pf.enabled:
        return ["pflash: off"]
    # parallel_config None: install_pflash checks the drafter against the target and binds nothing
    vocab = text.get("vocab_size")
    model_config = SimpleNamespace(get_vocab_size=lambda: vocab) if vocab else None
    described = install_pflash(SimpleNamespace(model_config=model_config, parallel_config=None), luce)
    return ["pflash: on", f"  scorer: {described.summary}",
            (f"  keep_curve {pf.keep_curve} (overrides keep_ratio), " if pf.keep_curve else "  ")
            + f"chunks of {pf.chunk_tokens} tokens, the first {pf.head_chunks} and last {pf.tail_chunks} always kept, "
            f"anchors {'on' if pf.anchors else 'off'}",
            f"  scorer attention {pf.attention}"
            + (" (block-sparse on CUDA, dense elsewhere)" if pf.attention == "auto" else "")
            + f", dtype {pf.dtype}" + (" (bf16; fp16 on GPUs without bf16; fp32 on CPU)" if pf.dtype == "auto" else "")
            + f", early_exit_layers {pf.early_exit_layers or 'every layer'}"]


def check(model: str, additional_config: dict | None = None, max_model_len: int | None = None,
          tensor_parallel: int = 1, spec_model: str | None = None, spec_tokens: int | None = None) -> list[str]:
    """Every resolved value of a configuration, a line each; raises one of CHECK_ERRORS where startup would stop."""
    from vllm_luce.version import __version__
    from vllm_luce.compat import check_vllm_version, supported_range
    from vllm_luce.architectures import EXECUTORS, executors_mode

    check_environment()
    luce = LuceConfig.from_sources(additional_config)
    version = installed_vllm_version()
    if version is None:
        raise CheckError(f"vLLM is not installed; vllm-luce supports vLLM {supported_range()}")
    warning = check_vllm_version(version)
    lines = [f"vllm-luce {__version__}; vLLM {version}: "
             + (f"NOT SUPPORTED, run anyway ({warning})" if warning else f"supported ({supported_range()})")]
    where, config = read_model_config(model)
    text = text_config(config)
    architectures = list(config.get("architectures") or [])
    mode = executors_mode()
    served = [a for a in architectures if a in EXECUTORS] if mode == "auto" else []
    lines.append(f"model: {model} (config {where}), architecture {', '.join(architectures) or 'none given'}: "
                 + (f"vllm-luce executor {EXECUTORS[served[0]].rsplit(':', 1)[1]}" if served else
                    f"vLLM's own class ({'VLLM_LUCE_EXECUTORS=off' if mode == 'off' else 'no vllm-luce executor'}; "
                    "KVFlash refuses it)"))
    if max_model_len is None:
        max_model_len = text.get("max_position_embeddings")
        if not isinstance(max_model_len, int):
            raise CheckError(f"{where} has no max_position_embeddings; pass --max-model-len")
        lines.append(f"max_model_len: {max_model_len} (config.json max_position_embeddings)")
    else:
        lines.append(f"max_model_len: {max_model_len} (--max-model-len)")
    lines.append(f"tensor_parallel_size: {tensor_parallel}")
    dflash, lookahead = dflash_lines(luce, spec_model, spec_tokens, model, text)
    lines += dflash
    lines += kvflash_lines(luce, architectures, text, max_model_len, tensor_parallel, lookahead)
    lines += pflash_lines(luce, text)
    lines.append("OK: vllm-luce's startup checks pass (vLLM's own checks run when it starts)")
    return lines
