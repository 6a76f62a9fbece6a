"""LuceConfig: the one configuration surface of vllm-luce (no vLLM import).

Sources, lowest to highest precedence:
  1. defaults below (every feature off);
  2. environment variables `VLLM_LUCE_<SECTION>_<KEY>` (e.g. `VLLM_LUCE_KVFLASH_POOL_TOKENS=4096`),
     and `VLLM_LUCE_<SECTION>=1` to switch a section on with its defaults;
  3. vLLM's own `--additional-config '{"luce": {"<section>": {"<key>": value}}}'`.

A section that appears (in either source) is enabled unless it says `"enabled": false`.
Every key is validated; any problem raises LuceConfigError naming the key, the value given and
what is accepted, so `vllm serve` stops at startup instead of misbehaving later.

Resolved once: an 'auto' that depends only on the settings (`Key.auto`) becomes its value when the config is
built, and the process that builds vLLM's VllmConfig writes the result into its additional_config
(`LuceConfig.attach`), which every other process of the server receives and reads (`from_vllm_config`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

ENV_PREFIX = "VLLM_LUCE_"
ADDITIONAL_CONFIG_KEY = "luce"
# Where the first process writes the resolved settings into vLLM's additional_config (``LuceConfig.attach``).
RESOLVED_KEY = "luce_resolved"
# Environment variables that are not LuceConfig keys: read at plugin registration, or by
# scripts/setup.sh and scripts/env.sh (VENV, the virtual environment's folder).
NON_CONFIG_ENV = {"SKIP_VERSION_CHECK", "EXECUTORS", "DRAFTER", "VENV"}


@dataclass(frozen=True)
class Installed:
    """What a feature's install in the config-parsing process did (``hooks.py``'s feature rows), as data the VllmConfig
    patch reads: ``summary`` for the startup log, and whether vLLM's engine clients need vllm-luce's patches
    (``engine_client``: per-request switches, PFlash's compression, KVFlash's refusal of a prompt beyond its host
    share)."""
    summary: str
    engine_client: bool = True


class LuceConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Key:
    """One validated setting: `kind` is the Python type(s) accepted, `check` the range test, `help` what the
    setting does (docs/reference.md's configuration table is generated from `accepted` and `help`)."""

    default: Any
    kind: type | tuple[type, ...]
    accepted: str
    check: Callable[[Any], bool] = lambda value: True
    help: str = ""
    # For a key whose 'auto' depends only on its section's other settings: the value 'auto' stands for, resolved
    # once when the LuceConfig is built (an 'auto' that depends on the host, device or model resolves where that
    # is known).
    auto: Callable[[Mapping[str, Any]], Any] | None = None


def _positive_int_or_auto(value: Any) -> bool:
    return value == "auto" or (isinstance(value, int) and value > 0)


# kvflash.pool_tokens 'auto': 4096 tokens, Lucebox's default budget (72 MiB of resident KV for Qwen3.6-27B at any
# context), rounded down to whole chunks.
AUTO_POOL_TOKENS = 4096


def _auto_pool_tokens(section: Mapping[str, Any]) -> int:
    chunk = section["chunk_tokens"]
    return max(AUTO_POOL_TOKENS // chunk, 1) * chunk


def _power_of_two(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: lo <= v <= hi and v & (v - 1) == 0


def _keep_curve(value: Any) -> bool:
    try:
        points = [(int(t), float(r)) for t, r in value]
    except (TypeError, ValueError):
        return False
    ok_types = all(isinstance(t, int) and not isinstance(t, bool) for t, _ in value)
    return ok_types and all(0.0 < r <= 1.0 for _, r in points) and all(
        a[0] < b[0] for a, b in zip(points, points[1:]))


# Section -> key -> Key. Sections are the features; `enabled` is implicit in every section.
SCHEMA: dict[str, dict[str, Key]] = {
    # On by default whenever vLLM speculates with method "dflash" (`--speculative-model dflash`);
    # `{"dflash": false}` or `{"dflash": {"gate": false}}` turns it off.
    "dflash": {
        "gate": Key(True, bool, "true or false",
                    help="the self-calibrating gate; on whenever vLLM speculates with DFlash"),
        "verify_confidence": Key(0.0, (int, float), "a number in [0, 1) (0 verifies every draft)",
                                 lambda v: 0.0 <= v < 1.0,
                                 help="adaptive verify width: each request verifies only the draft prefix whose "
                                      "product of top-1 drafter probabilities stays at or above it (V1 runner only)"),
        "min_verify_tokens": Key(1, int, "an integer >= 1", lambda v: v >= 1,
                                 help="the fewest drafts adaptive verify width verifies"),
        "plain_context_stash": Key("auto", (int, str), "an integer >= 0 (tokens; 0 writes every step) or 'auto'",
                                   lambda v: v == "auto" or (isinstance(v, int) and v >= 0),
                                   help="the gate's plain steps hold up to this many tokens of the drafter's context "
                                        "inputs on the GPU (40 KB a token at Qwen3-8B-DFlash's shape) and write them "
                                        "in one pass when the drafter next runs, a request starts, ends or is "
                                        "preempted, or the stash is full. Applies to vLLM 0.26 with Model Runner V2 "
                                        "on CUDA; auto is 1024 there and 0 elsewhere"),
    },
    "kvflash": {
        "pool_tokens": Key("auto", (int, str), "a positive integer or 'auto'", _positive_int_or_auto,
                           help="each request's full-attention KV budget in tokens: a multiple of chunk_tokens, "
                                "at least (sink_chunks + recent_chunks + 1) chunks; auto is 4096",
                           auto=_auto_pool_tokens),
        "chunk_tokens": Key(64, int, "a power of two in [16, 1024]", _power_of_two(16, 1024),
                            help="tokens per chunk, the unit of eviction, paging and reselection"),
        "sink_chunks": Key(1, int, "an integer >= 1", lambda v: v >= 1,
                           help="chunks at the start of the context that always stay resident"),
        "recent_chunks": Key(4, int, "an integer >= 4", lambda v: v >= 4,
                             help="chunks at the end of the context that always stay resident"),
        "policy": Key("salient", str, "one of 'lru', 'qk', 'bounds', 'salient', 'scorer', 'attention' (SFI only)",
                      lambda v: v in ("lru", "qk", "bounds", "salient", "scorer", "attention"),
                      help="which chunks stay resident: salient (per chunk and KV head two keys, the one farthest from "
                           "the chunk's mean key and the one farthest from both, their unrotated dims in int4: 0.2-0.25x "
                           "qk's summary bytes; a chunk scores at least its predecessor; the default, docs/fidelity.md); "
                           "lru (sinks and the recent window); qk (cosine of each "
                           "chunk's mean key with the latest query); bounds (the largest possible attention logit "
                           "per 16-token page, from its key minimum and maximum in fp8, 2x QK's summary bytes); scorer (PFlash's drafter; "
                           "needs pflash.drafter); attention (the largest attention logit over each chunk's keys; "
                           "needs selection sfi)"),
        "query_window": Key(8, int, "an integer in [1, 64] (tokens whose queries a reselection scores with)",
                            lambda v: 1 <= v <= 64,
                            help="reselections score chunks with the queries of the last N tokens (the prompt's "
                                 "last N before its final token, then each decoded token)"),
        "selection": Key("page", str, "one of 'page' (bounded residency, cold chunks paged to host) or 'sfi' "
                         "(all KV resident, decode attends to a pool-sized selection with dense refresh steps)",
                         lambda v: v in ("page", "sfi"),
                         help="sfi (Slow-Fast Inference): decode steps attend to pool_tokens of sinks, top-scored "
                              "chunks and the recent tail, with a dense refresh step every tau tokens "
                              "(docs/fidelity.md)"),
        "host_bytes": Key("auto", (int, str), "a positive integer (bytes of host memory for paged-out KV on this "
                          "host) or 'auto' (half the memory available when the first server on the host starts, "
                          "within its container's memory limit; a quarter in a container with no limit)",
                          _positive_int_or_auto,
                          help="the host's budget, shared by every server, data-parallel engine and rank that uses the "
                               "same host_ledger (pinned and pageable memory both count); a request whose page-outs "
                               "would not fit waits, as for KV blocks (docs/kvflash.md, Host memory)"),
        "host_request_bytes": Key("auto", (int, str), "a positive integer (bytes) or 'auto' (a quarter of host_bytes, "
                                  "or what one request of max_model_len tokens pages out if that is more; at most "
                                  "half of host_bytes; an explicit value at most host_bytes)", _positive_int_or_auto,
                                  help="the most host memory one request may hold (the n children of a request for n "
                                       "samples split it): a longer prompt is refused with an error naming this "
                                       "setting, and a request stops (finish reason length) where its context would "
                                       "need more"),
        "host_wait_s": Key(300.0, (int, float), "a number of seconds > 0", lambda v: v > 0,
                           help="the longest a request waits for host memory for its page-outs; then it ends with an "
                                "error naming this setting (counted in vllm:luce_kvflash_host_wait_errors), and so "
                                "does at once a request that would need more than host_request_bytes"),
        "host_full": Key("wait", str, "'wait' or 'drop'", lambda v: v in ("wait", "drop"),
                         help="what happens when the host budget is spent: wait (requests are held back until memory "
                              "frees; nothing is lost) or drop (each worker drops its coldest chunks beyond its share "
                              "of host_bytes, counted in vllm:luce_kvflash_host_budget_drops; opt-in)"),
        "host_ledger": Key("/dev/shm/vllm-luce-kvflash-host", str, "a file path", lambda v: len(v) > 0,
                           help="the file through which the servers of one host share host_bytes; give a server its "
                                "own file to give it its own budget"),
        "gpu_cold": Key(True, bool, "true or false",
                        help="cold chunks go first to KV cache blocks vLLM has free (beyond a tenth of the cache kept "
                             "free for other requests), copied inside the GPU; host memory takes the rest"),
        "host_pinned_bytes": Key("auto", (int, str), "an integer >= 0 (bytes of host memory each worker pins for "
                                 "paged-out KV at startup) or 'auto' (what one request of max_model_len tokens pages "
                                 "out)", lambda v: v == "auto" or (isinstance(v, int) and v >= 0),
                                 help="pinned while the server starts, never while it serves, within host_bytes; "
                                      "page-outs beyond it copy to pageable memory, synchronously, which stalls the "
                                      "engine (GPU only; docs/kvflash.md)"),
        "audit": Key(False, bool, "true or false",
                     help="a diagnostic (Model Runner V1): each step checks that no KV cache block is held by two "
                          "requests and that the pooled layers' new tokens land in their own request's blocks, "
                          "counted in the workers' KVFlash totals and logged; costs host time every step"),
        "log_choices": Key(False, bool, "true or false",
                           help="a diagnostic: when a paged request ends, log its chunk choices (per choosing "
                                "decision: its position, a digest of the resident chunks and how close the call was), "
                                "to tell "
                                "whether two runs of one request parted after a near-tied choice "
                                "(vllm_luce/kvflash/choices.py); one line per paged request"),
        "verify_pages": Key(False, bool, "true or false",
                            help="a diagnostic: each chunk paged out keeps a checksum of its bytes, compared with the "
                                 "bytes it pages back in with; a difference is counted "
                                 "(vllm:luce_kvflash_page_mismatches_total) and logged. Costs a read of each chunk "
                                 "paged and a device sync at each reselection that pages in"),
    },
    "pflash": {
        "drafter": Key("", str, "a path to a Hugging Face causal LM directory (config.json + safetensors)",
                       lambda v: len(v) > 0,
                       help="required when PFlash is on: the Qwen3, Qwen2, Llama or Mistral model that scores "
                            "the prompt"),
        "keep_ratio": Key(0.05, (int, float), "a number in (0, 1]", lambda v: 0.0 < v <= 1.0,
                          help="share of a long prompt's chunks the target prefills"),
        "keep_curve": Key([], list, "a list of [prompt_tokens, keep_ratio] pairs, prompt_tokens increasing, "
                          "ratios in (0, 1]", _keep_curve,
                          help="the keep ratio piecewise linear by prompt length; overrides keep_ratio"),
        "min_prompt_tokens": Key(4096, int, "an integer >= 1", lambda v: v >= 1,
                                 help="shorter prompts are never compressed"),
        "chunk_tokens": Key(32, int, "an integer in [1, 4096]", lambda v: 1 <= v <= 4096,
                            help="tokens per selection chunk"),
        "head_chunks": Key(8, int, "an integer >= 0", lambda v: v >= 0,
                           help="first chunks always kept (scaled down when over budget)"),
        "tail_chunks": Key(24, int, "an integer >= 1", lambda v: v >= 1,
                           help="last chunks always kept (scaled down when over budget)"),
        "anchors": Key(True, bool, "true or false",
                       help="lexical anchor rescue: the chunks around exact 4-gram matches of the question are "
                            "kept too (at most as many again)"),
        "lookahead_tokens": Key(8, int, "an integer in [1, 256]", lambda v: 1 <= v <= 256,
                                help="the last prompt tokens whose queries score the prompt"),
        "pool_kernel": Key(13, int, "an odd integer >= 1", lambda v: v >= 1 and v % 2 == 1,
                           help="width of the average pooling of token scores"),
        "pre_rope": Key(True, bool, "true or false", help="score with pre-RoPE queries and keys"),
        "early_exit_layers": Key(0, int, "an integer >= 0 (0: every layer)", lambda v: v >= 0,
                                 help="score with the drafter's first N layers only; at most the drafter's layers"),
        "attention": Key("auto", str, "one of 'auto', 'dense', 'sparse'", lambda v: v in ("auto", "dense", "sparse"),
                         help="the drafter's attention: auto is block-sparse on CUDA, dense elsewhere"),
        "sparse_alpha": Key(0.12, (int, float), "a number in [0, 1]", lambda v: 0.0 <= v <= 1.0,
                            help="block-sparse attention keeps the blocks scoring at least alpha x the best"),
        "dtype": Key("auto", str, "one of 'auto', 'bfloat16', 'float16', 'float32'",
                     lambda v: v in ("auto", "bfloat16", "float16", "float32"),
                     help="the drafter's dtype: auto is bf16, fp16 on GPUs without bf16, fp32 on CPU"),
        "max_queued_prompts": Key(32, int, "an integer >= 1", lambda v: v >= 1,
                                  help="prompts the scoring queue takes, waiting or being scored (one pass runs at "
                                       "a time); a prompt beyond them is prefilled uncompressed at once (outcome "
                                       "queue_full). API server only: the offline LLM scores each prompt as it adds "
                                       "it"),
        "queue_timeout_s": Key(30, (int, float), "a number > 0 (seconds)", lambda v: v > 0,
                               help="a prompt whose scoring pass has not ended this long after it arrived is "
                                    "prefilled uncompressed (outcome deadline): a waiting pass leaves the queue, a "
                                    "running one's answer is dropped. API server only"),
    },
}

# Features whose implementation has landed. Enabling any other section stops startup:
# accepting a setting that does nothing would be worse than refusing it.
AVAILABLE_FEATURES: frozenset[str] = frozenset({"dflash", "kvflash", "pflash"})
# Features on by default when what they improve is in use (here: DFlash speculation).
DEFAULT_ON_WHEN_USED: frozenset[str] = frozenset({"dflash"})


@dataclass(frozen=True)
class FeatureConfig:
    name: str
    enabled: bool
    settings: Mapping[str, Any]
    given: bool = False  # set by the user (environment or --additional-config), not just defaults
    auto: frozenset[str] = frozenset()  # keys given or left as 'auto', resolved by their Key.auto

    def on_when_used(self) -> bool:
        """For DEFAULT_ON_WHEN_USED features: on unless the user switched it off."""
        return self.enabled or (not self.given and self.name in DEFAULT_ON_WHEN_USED)

    def __getattr__(self, key: str) -> Any:
        try:
            return self.settings[key]
        except KeyError:
            raise AttributeError(key) from None


@dataclass(frozen=True)
class LuceConfig:
    features: Mapping[str, FeatureConfig] = field(default_factory=dict)

    @property
    def active(self) -> list[FeatureConfig]:
        return [f for f in self.features.values() if f.enabled]

    def __getattr__(self, name: str) -> FeatureConfig:
        if name in SCHEMA:
            return self.features[name]
        raise AttributeError(name)

    def describe(self) -> str:
        """`dflash(gate=True, ...), kvflash(...)` or `none`: the startup log's feature list."""
        parts = []
        for feature in self.active:
            settings = ", ".join(f"{k}={v!r}" for k, v in sorted(feature.settings.items()))
            parts.append(f"{feature.name}({settings})")
        return "; ".join(parts) if parts else "none"

    @classmethod
    def from_sources(cls, additional_config: Any = None,
                     environ: Mapping[str, str] | None = None) -> "LuceConfig":
        environ = os.environ if environ is None else environ
        layered = _from_environ(environ)
        for section, values in _from_additional_config(additional_config).items():
            layered.setdefault(section, {}).update(values)
        return cls(features={name: _build_feature(name, layered.get(name)) for name in SCHEMA})

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> "LuceConfig":
        """The settings the first process resolved (``attach``), in every process that receives its VllmConfig;
        resolved from the sources where none were attached (a platform's own additional_config object)."""
        additional = getattr(vllm_config, "additional_config", None)
        if isinstance(additional, Mapping) and RESOLVED_KEY in additional:
            return cls.from_plain(additional[RESOLVED_KEY])
        return cls.from_sources(additional)

    def attach(self, vllm_config: Any) -> None:
        """Hand these resolved settings to every process of the server: vLLM pickles the VllmConfig, and its
        additional_config with it, to the engine core and every worker. Their environment (another node's, say) is
        not read again."""
        additional = getattr(vllm_config, "additional_config", None)
        if isinstance(additional, dict):
            additional[RESOLVED_KEY] = self.to_plain()

    def to_plain(self) -> dict[str, Any]:
        """JSON-ready: vLLM hashes additional_config as JSON."""
        return {name: {"enabled": f.enabled, "given": f.given, "auto": sorted(f.auto), "settings": dict(f.settings)}
                for name, f in self.features.items()}

    @classmethod
    def from_plain(cls, plain: Mapping[str, Any]) -> "LuceConfig":
        """``to_plain``'s form back, each value other than its default validated again (a hand-written one gets the
        same errors)."""
        where = f"additional_config {RESOLVED_KEY!r}"
        if not isinstance(plain, Mapping) or set(plain) != set(SCHEMA):
            raise LuceConfigError(f"{where}: expected the form vllm-luce writes, one entry per feature "
                                  f"({', '.join(SCHEMA)}); leave the key out to have it written")
        features = {}
        for name, record in plain.items():
            given = record.get("settings") if isinstance(record, Mapping) else None
            if not isinstance(given, Mapping) or set(given) != set(SCHEMA[name]) or \
                    not {"enabled", "given", "auto"} <= set(record):
                raise LuceConfigError(f"{where}.{name}: expected enabled, given, auto and settings with the keys "
                                      f"{', '.join(SCHEMA[name])}")
            settings = {key: value if value == SCHEMA[name][key].default else
                        _validate(SCHEMA[name][key], value, f"{where}.{name}.{key}") for key, value in given.items()}
            features[name] = FeatureConfig(name, bool(record["enabled"]), settings, bool(record["given"]),
                                           frozenset(record["auto"]))
        return cls(features=features)


def _from_additional_config(additional_config: Any) -> dict[str, dict[str, Any]]:
    if not additional_config:
        return {}
    if not isinstance(additional_config, Mapping):
        return {}  # a platform's own SupportsHash object: not ours to read
    luce = additional_config.get(ADDITIONAL_CONFIG_KEY)
    if luce is None:
        return {}
    where = f"--additional-config {ADDITIONAL_CONFIG_KEY!r}"
    if not isinstance(luce, Mapping):
        raise LuceConfigError(f"{where}: got {luce!r}; expected a JSON object such as "
                              f'{{"{ADDITIONAL_CONFIG_KEY}": {{"kvflash": {{"pool_tokens": 4096}}}}}}')
    out: dict[str, dict[str, Any]] = {}
    for section, values in luce.items():
        if section not in SCHEMA:
            raise LuceConfigError(f"{where}: unknown key {section!r}; accepted keys: {', '.join(SCHEMA)}")
        if isinstance(values, bool):
            values = {"enabled": values}
        if not isinstance(values, Mapping):
            raise LuceConfigError(f"luce.{section}: got {values!r}; expected a JSON object of settings "
                                  f"or true/false")
        out[section] = {key: (value, f"luce.{section}.{key}") for key, value in values.items()}
    return out


def _from_environ(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX):]
        if rest in NON_CONFIG_ENV:
            continue
        section = next((s for s in SCHEMA if rest == s.upper() or rest.startswith(s.upper() + "_")), None)
        if section is None:
            raise LuceConfigError(
                f"unknown environment variable {name}; accepted: "
                f"{', '.join(ENV_PREFIX + s.upper() + '[_<KEY>]' for s in SCHEMA)}, "
                f"{', '.join(ENV_PREFIX + n for n in sorted(NON_CONFIG_ENV))}")
        key = "enabled" if rest == section.upper() else rest[len(section) + 1:].lower()
        out.setdefault(section, {})[key] = (_parse_env_value(raw), name)
    return out


def _parse_env_value(raw: str) -> Any:
    """Numbers and booleans as JSON would read them; anything else stays a string."""
    lowered = raw.strip().lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, (int, float, bool)) else raw


def _build_feature(name: str, given: dict[str, tuple[Any, str]] | None) -> FeatureConfig:
    schema = SCHEMA[name]
    settings = {key: spec.default for key, spec in schema.items()}
    if given is None:  # the section does not appear; an empty one ({}) switches the feature on with its defaults
        return _resolve_auto(FeatureConfig(name, False, settings))
    enabled = True
    for key, (value, where) in given.items():
        if key == "enabled":
            if not isinstance(value, bool) and value not in (0, 1):
                raise LuceConfigError(f"{where}: got {value!r}; expected true or false")
            enabled = bool(value)
            continue
        spec = schema.get(key)
        if spec is None:
            raise LuceConfigError(f"{where}: unknown key {key!r}; accepted keys for {name}: "
                                  f"enabled, {', '.join(schema)}")
        settings[key] = _validate(spec, value, where)
    if enabled and name not in AVAILABLE_FEATURES:
        raise LuceConfigError(
            f"luce.{name}: {name} is not available in this version of vllm-luce; remove the "
            f"setting or set it to {{\"enabled\": false}}. Available features: "
            f"{', '.join(sorted(AVAILABLE_FEATURES)) or 'none yet'}")
    return _resolve_auto(FeatureConfig(name, enabled, settings, given=True))


def _resolve_auto(feature: FeatureConfig) -> FeatureConfig:
    schema = SCHEMA[feature.name]
    autos = {key for key, value in feature.settings.items() if value == "auto" and schema[key].auto is not None}
    if not autos:
        return feature
    settings = dict(feature.settings)
    for key in autos:
        settings[key] = schema[key].auto(feature.settings)
    return FeatureConfig(feature.name, feature.enabled, settings, feature.given, frozenset(autos))


def _validate(spec: Key, value: Any, where: str) -> Any:
    kinds = spec.kind if isinstance(spec.kind, tuple) else (spec.kind,)
    # bool is an int subclass: `true` is never a valid size or ratio.
    wrong_type = not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)
    if wrong_type or not spec.check(value):
        raise LuceConfigError(f"{where}: got {value!r}; expected {spec.accepted}")
    return value
