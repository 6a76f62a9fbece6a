"""Every way vllm-luce touches vLLM, in one table (``HOOKS``), and the helpers that perform the touches.

A row is one vLLM target and says its kind, the vllm-luce functions or modules that own it (``owners``,
"module:qualname" or a patch module), the feature it serves and why. Patches add their ledger entry
(``patches/ledger.py``: signatures per vLLM series, how, removal condition) and the stage at which
``apply_patches`` applies them; feature installs say where vLLM runs them.

Nothing binds to vLLM outside this table:

* ``bind(target, obj, value)`` sets an attribute on a vLLM object (a rebinding or a setting) and
  ``register(target, *args)`` calls a vLLM registry; both refuse a target that has no row, or a caller
  that is not one of the row's owners.
* ``patches.apply_patches`` and ``apply_engine_client_patches`` iterate the patch rows; the VllmConfig
  patch and the ``initialize_kv_cache`` patches run the feature-install rows.
* ``tests/test_hooks.py`` scans vllm_luce/ for attribute stores, ``setattr`` and registry calls that do
  not go through these helpers (attributes named ``luce_*``/``_luce_*`` are vllm-luce's own, on any
  object), and checks that every owner exists.

docs/architecture.md's hook table and patch ledger are rendered from here
(``python -m tests.test_docs --write-ledger``).

vllm-luce changes vLLM only where a feature or a vLLM bug needs it. The speed-ups of vLLM's CPU backend that only
serve this project's test hosts are not vllm-luce's: they are the test environment's plugin
``testenv/luce_cpu_speedups`` (its own table, ``luce_cpu_speedups.PATCHES``), which scripts/setup.sh installs.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any, Callable

from vllm_luce.patches.ledger import LEDGER, LedgerEntry

REGISTRY = "registry"
CLASS_PATH = "class-path setting"
SETTING = "config setting"
PATCH = "patch"
REBINDING = "attribute rebinding"
FEATURE = "feature install"
KINDS = (REGISTRY, CLASS_PATH, SETTING, PATCH, REBINDING, FEATURE)

# When apply_patches and apply_engine_client_patches apply a patch row (stage of a PATCH row).
STARTUP = "at register(), in every process"
ON_IMPORT = "right after its module is first imported"
ENGINE_CLIENT = "by the VllmConfig patch, with the DFlash gate, PFlash or paged KVFlash on"
ENGINE_CLIENT_PFLASH = "by the VllmConfig patch, with PFlash on"
SCHEDULER_START = "an override in vllm-luce's scheduler classes, checked when the scheduler starts"
# Where a FEATURE row runs (its stage).
BEFORE_CHECKS = "VllmConfig.__post_init__, before vLLM's checks"
AFTER_CHECKS = "VllmConfig.__post_init__, after vLLM's checks"
KV_CACHE_V1 = "after V1's GPUModelRunner.initialize_kv_cache"
KV_CACHE_V2 = "after Model Runner V2's initialize_kv_cache"
KV_CACHE_BOTH = "after either runner's initialize_kv_cache"
AT_REGISTER = "at register(), in every process"


class HookNotInTable(RuntimeError):
    pass


@dataclass(frozen=True)
class Hook:
    kind: str
    target: str
    owners: tuple[str, ...]
    feature: str
    why: str
    stage: str = ""
    ledger: LedgerEntry | None = None

    def function(self) -> Callable:
        """The owner ("module:qualname") of a one-owner row, imported."""
        (owner,) = self.owners
        return resolve(owner)


def resolve(path: str) -> Any:
    """``module:attr.attr`` (or a bare module name) imported."""
    module_name, _, qualname = path.partition(":")
    obj = importlib.import_module(module_name)
    for part in qualname.split(".") if qualname else ():
        obj = getattr(obj, part)
    return obj


def _row(kind: str, target: str, owners, feature: str, why: str, stage: str = "") -> Hook:
    return Hook(kind, target, (owners,) if isinstance(owners, str) else tuple(owners), feature, why, stage)


def _patch(target: str, feature: str, stage: str, why: str) -> Hook:
    entry = next(e for e in LEDGER if e.target == target)
    return Hook(PATCH, target, (entry.module,), feature, why, stage, entry)


L, P, X = "vllm_luce", "vllm_luce.patches", "vllm_luce.model_executor"
KV, SD, PF = "vllm_luce.kvflash", "vllm_luce.spec_decode", "vllm_luce.pflash"
SCHED_CONFIG, ENGINE_ARGS = "vllm.config.scheduler:SchedulerConfig", "vllm.engine.arg_utils:EngineArgs"

# Each ledger entry's feature, stage and purpose (the ledger holds signatures, how and removal condition).
PATCHES: dict[str, tuple[str, str, str]] = {
    "vllm.config.vllm:VllmConfig.__post_init__": (
        "config", STARTUP, "validate `--additional-config {\"luce\": ...}` before vLLM's checks; run the feature "
        "installs; log the active features"),
    f"{ENGINE_ARGS}.add_cli_args": ("DFlash", STARTUP, "`--speculative-model`; strict `--additional-config`"),
    f"{ENGINE_ARGS}.create_speculative_config": ("DFlash", STARTUP,
                                                 "drafter resolution, defaults and drafter/target checks"),
    "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention:_spec_forward": (
        "DFlash", ON_IMPORT, "CPU (vLLM bug): variable draft counts on hybrid (GDN) targets"),
    "vllm._custom_ops:fused_sigmoid_gating_delta_rule_update_cpu": (
        "DFlash", ON_IMPORT, "CPU (vLLM bug): unit-stride inputs for the GDN decode of a step without spec rows"),
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner.take_draft_token_ids": (
        "DFlash", ON_IMPORT, "V1: cut each request's drafts to its verify width"),
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs": (
        "DFlash", ON_IMPORT, "V1 on vLLM 0.26 (vLLM bug): a hybrid target's state for a decode without drafts"),
    "vllm.v1.spec_decode.dflash:DFlashProposer.propose": (
        "DFlash", ON_IMPORT, "V1: on the gate's plain steps run only the drafter's context pass"),
    "vllm._custom_ops:rms_norm": (
        "DFlash", ON_IMPORT, "CPU (vLLM bug): DFlash drafters' grouped (per-layer) norm weights"),
    "vllm.utils.cpu_triton_utils:_expand_kernel_impl": (
        "DFlash", ON_IMPORT,
        "CPU (vLLM bug): per-request sampling values in the rejection sampler (vLLM's were unwritten)"),
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner.initialize_kv_cache": (
        "KVFlash; PFlash", ON_IMPORT, "V1: run the worker-side feature installs once the KV cache exists"),
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.initialize_kv_cache": (
        "KVFlash; PFlash", ON_IMPORT, "Model Runner V2: the same"),
    "vllm.v1.core.sched.scheduler:Scheduler._mamba_block_aligned_split": (
        "KVFlash", SCHEDULER_START, "a pooled prompt's last token in a step of its own"),
    "vllm.v1.engine.async_llm:AsyncLLM.add_request": (
        "PFlash; DFlash; KVFlash", ENGINE_CLIENT, "check per-request switches (an HTTP 400); compress eligible "
        "prompts; refuse a prompt beyond KVFlash's host share (an HTTP 400)"),
    "vllm.v1.engine.llm_engine:LLMEngine.add_request": ("PFlash; DFlash; KVFlash", ENGINE_CLIENT,
                                                        "the same for the offline LLM API"),
    "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest.to_sampling_params": (
        "PFlash", ENGINE_CLIENT_PFLASH, "mark tool and response-format requests, never compressed"),
}

HOOKS: tuple[Hook, ...] = (
    # registries
    _row(REGISTRY, "entry point vllm.general_plugins: luce", f"{L}:register", "all",
         "vLLM calls register() in every process (pyproject.toml); everything below starts there"),
    _row(REGISTRY, "vllm.model_executor.models:ModelRegistry.register_model",
         (f"{X}.registry:register_executors", f"{X}.registry:register_drafters"), "executors; DFlash",
         "the Luce executors under the upstream architecture names (lazy \"module:Class\"); the DFlash "
         "drafter class for DFlashDraftModel (non-finite guard, draft confidences)"),
    _row(REGISTRY, "vllm.v1.kv_cache_spec_registry:KVCacheSpecRegistry._ensure_registered", f"{KV}.spec:_register",
         "KVFlash", "private: vLLM fills its built-in specs only while the registry is empty, so they go first"),
    _row(REGISTRY, "vllm.v1.kv_cache_spec_registry:KVCacheSpecRegistry.register", f"{KV}.spec:_register",
         "KVFlash", "KVFlashSpec (per-request pool) and KVFlashManager, a group type of their own"),
    _row(REGISTRY, "prometheus_client:REGISTRY.register", "vllm_luce.metrics:install", "metrics",
         "the vllm:luce_* collector in the default registry vLLM serves at /metrics and LLM.get_metrics() reads"),
    # class-path settings
    _row(CLASS_PATH, f"{SCHED_CONFIG}.scheduler_cls", (f"{SD}.install:install_gate", f"{KV}.install:_install_scheduler"),
         "DFlash; KVFlash", "the gated scheduler when vLLM speculates with DFlash; else KVFlash's scheduler "
         "(a pooled prompt's last token in a step of its own). Another user class stops startup"),
    _row(CLASS_PATH, "vllm.config.parallel:ParallelConfig.worker_extension_cls", f"{PF}.install:_install_worker_extension",
         "PFlash", "PFlash's scorer method on the worker, reached by collective_rpc"),
    # config settings
    _row(SETTING, "vllm.config.cache:CacheConfig.enable_prefix_caching", f"{KV}.install:before_vllm_checks",
         "KVFlash", "off: a pooled request's KV is not a function of its prefix (before vLLM's checks, which size "
         "Mamba blocks from it)"),
    _row(SETTING, f"{SCHED_CONFIG}.max_num_scheduled_tokens", f"{KV}.install:install_kvflash", "KVFlash",
         "a step's new tokens must fit a request's pool beside the sinks"),
    _row(SETTING, f"{SCHED_CONFIG}.long_prefill_token_threshold", f"{KV}.install:install_kvflash", "KVFlash",
         "the same cap per request"),
    _row(SETTING, f"{ENGINE_ARGS}.spec_model", f"{P}.engine_args:apply_dflash_defaults", "DFlash",
         "`--speculative-model dflash` resolved to the drafter's path"),
    _row(SETTING, f"{ENGINE_ARGS}.spec_method", f"{P}.engine_args:apply_dflash_defaults", "DFlash",
         "'dflash' where the user left it unset"),
    _row(SETTING, f"{ENGINE_ARGS}.spec_tokens", f"{P}.engine_args:apply_dflash_defaults", "DFlash",
         "the drafter's block size - 1 where the user left it unset"),
    _row(SETTING, f"{ENGINE_ARGS}.speculative_config", f"{P}.engine_args:apply_dflash_defaults", "DFlash",
         "the same defaults for `--speculative-config`"),
    _row(SETTING, f"{ENGINE_ARGS}.max_num_seqs", f"{P}.engine_args:fit_draft_slots", "DFlash",
         "where unset and vLLM's defaults leave no room for DFlash's draft slots in the step's token budget"),
    _row(SETTING, "vllm.sampling_params:SamplingParams.extra_args", f"{P}.chat_completion_request:_make_wrapper",
         "PFlash", "luce_pflash_skip: a tool or response-format request is never compressed"),
    # attribute rebindings (instance attributes of one runner, layer or scheduler, unless said otherwise)
    _row(REBINDING, "vllm.model_executor.models:<upstream model class>.__name__",
         f"{X}.executor:LuceExecutor.__init_subclass__", "executors",
         "on each Luce executor class: vLLM dispatches on model.__class__.__name__"),
    _row(REBINDING, "vllm.model_executor.layers.attention:Attention.get_kv_cache_spec",
         f"{X}.executor:pool_full_attention", "KVFlash",
         "the full-attention layers that own their KV declare a KVFlashSpec"),
    _row(REBINDING, "vllm.v1.core.sched.scheduler:Scheduler.dynamic_sd_lookup", f"{SD}.scheduler:DFlashGateMixin.__init__",
         "DFlash", "the gate stands in for vLLM's dynamic-speculation table: K or 0 each step"),
    _row(REBINDING, "vllm.v1.request:Request.spec_token_ids", f"{SD}.scheduler:DFlashGateMixin.schedule", "DFlash",
         "emptied for a request that may not use its drafts this step (plain step, stopped or declined)"),
    _row(REBINDING, "vllm.v1.core.sched.scheduler:Scheduler.need_mamba_block_aligned_split",
         f"{KV}.scheduler:KVFlashSchedulerMixin.__init__", "KVFlash",
         "so vLLM calls _mamba_block_aligned_split, the override that ends a pooled prompt alone"),
    _row(REBINDING, "vllm.v1.request:Request.max_tokens", f"{KV}.scheduler:KVFlashSchedulerMixin.add_request",
         "KVFlash", "a request stops (finish reason length) where its context would need more host memory than "
         "luce.kvflash.host_request_bytes, as at max_model_len"),
    _row(REBINDING, "vllm.v1.worker.block_table:BlockTable.compute_slot_mapping", f"{KV}.worker:_bind_slot_mapping",
         "KVFlash", "V1: the pooled group's slots come from the pagers instead of row[pos // block]"),
    _row(REBINDING, "vllm.v1.worker.utils:AttentionGroup.metadata_builders",
         (f"{KV}.worker:bind_v1", f"{KV}.worker_v2:bind_v2"), "KVFlash",
         "wrapped builders: attention reads the resident tokens only"),
    _row(REBINDING, "vllm.v1.attention.backend:AttentionImpl.forward", f"{KV}.worker:_capture_queries", "KVFlash",
         "the pooled layers' queries, observed for the QK policy"),
    _row(REBINDING, "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states", f"{KV}.worker:_bind_release",
         "KVFlash", "V1: finished and preempted requests release their pagers"),
    _row(REBINDING, "vllm.v1.worker.gpu.block_table:BlockTables.append_block_ids", f"{KV}.worker_v2:bind_v2",
         "KVFlash", "V2: the pooled group's block rows mirrored on the host for the pagers"),
    _row(REBINDING, "vllm.v1.worker.gpu.block_table:BlockTables.compute_slot_mappings", f"{KV}.worker_v2:bind_v2",
         "KVFlash", "V2: the pooled group's row of slots from the pagers"),
    _row(REBINDING, "vllm.v1.worker.gpu.model_runner:GPUModelRunner.finish_requests", f"{KV}.worker_v2:bind_v2",
         "KVFlash", "V2: finished and preempted requests release their pagers"),
    _row(REBINDING, "vllm.v1.worker.gpu.model_runner:GPUModelRunner.prepare_attn", f"{KV}.worker_v2:bind_v2",
         "KVFlash", "V2: the step's InputBatch noted, whose host mirrors the pooled slot mapping reads"),
    _row(SETTING, "vllm.config.speculative:SpeculativeConfig.num_speculative_tokens_per_batch_size",
         f"{SD}.plain_steps:set_graph_table", "DFlash",
         "V2 on CUDA: draft lengths K and 0, so vLLM captures one-token decode graphs for the gate's plain steps"),
    _row(REBINDING, "vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model", f"{SD}.plain_steps:bind_v2",
         "DFlash", "V2: note whether the step's scheduler output asked for drafts"),
    _row(REBINDING, "vllm.v1.worker.gpu.spec_decode.dflash.speculator:DFlashSpeculator._generate_draft",
         f"{SD}.plain_steps:bind_v2", "DFlash", "V2: no drafter forward on a plain step (eager)"),
    _row(REBINDING, "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager.run_fullgraph", f"{SD}.plain_steps:bind_v2",
         "DFlash", "V2: no drafter forward on a plain step (graph replay; the drafter's graph manager only); "
         "from vLLM 0.32 the speculator's _prepare_graph_forward (the graph's context write) runs eagerly instead"),
    _row(REBINDING, "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.combine_hidden_states",
         f"{SD}.plain_steps:bind_context_stash", "DFlash",
         "V2 on vLLM 0.26 (plain_context_stash, on by default there): a stashable plain step's features held "
         "instead of projected"),
    _row(REBINDING, "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.precompute_and_store_context_kv",
         f"{SD}.plain_steps:bind_context_stash", "DFlash",
         "V2 on vLLM 0.26 (plain_context_stash): held context written in one pass before any other context write"),
    _row(REBINDING, "argparse:Action.type (vLLM's --additional-config)", f"{P}.engine_args:_make_add_cli_args",
         "config", "--additional-config parsed strictly as a JSON object"),
    # patches: one row per ledger entry, in the ledger's order (PATCHES below)
) + tuple(_patch(e.target, *PATCHES[e.target]) for e in LEDGER) + (
    # feature installs (run in table order)
    _row(FEATURE, "vllm.config.vllm:VllmConfig.__post_init__", f"{KV}.install:before_vllm_checks", "KVFlash",
         "settings vLLM's own checks must see (prefix caching)", BEFORE_CHECKS),
    _row(FEATURE, "vllm.config.vllm:VllmConfig.__post_init__", f"{SD}.install:install_gate", "DFlash",
         "the DFlash gate's scheduler class", AFTER_CHECKS),
    _row(FEATURE, "vllm.config.vllm:VllmConfig.__post_init__", f"{KV}.install:install_kvflash", "KVFlash",
         "validate the pool; scheduler class and step caps", AFTER_CHECKS),
    _row(FEATURE, "vllm.config.vllm:VllmConfig.__post_init__", f"{PF}.install:install_pflash", "PFlash",
         "check the drafter (no weights loaded); the worker extension", AFTER_CHECKS),
    _row(FEATURE, "vllm.v1.worker.gpu_model_runner:GPUModelRunner.initialize_kv_cache", f"{KV}.worker:bind_v1",
         "KVFlash", "bind the pagers to V1's KV cache, block table, builders and layers", KV_CACHE_V1),
    _row(FEATURE, "vllm.v1.worker.gpu.model_runner:GPUModelRunner.initialize_kv_cache", f"{KV}.worker_v2:bind_v2",
         "KVFlash", "the same for Model Runner V2", KV_CACHE_V2),
    _row(FEATURE, "vllm.v1.worker.gpu.model_runner:GPUModelRunner.initialize_kv_cache", f"{SD}.plain_steps:bind_v2",
         "DFlash", "plain steps write the drafter's context and skip its forward", KV_CACHE_V2),
    _row(FEATURE, "GPUModelRunner.initialize_kv_cache (V1 and V2)", f"{PF}.worker:bind", "PFlash",
         "load the PFlash drafter on rank 0 (after the KV cache: a drafter that cannot load stops startup)",
         KV_CACHE_BOTH),
    _row(FEATURE, "vllm_luce:register", "vllm_luce.metrics:install", "metrics",
         "the metrics directory and collector", AT_REGISTER),
)

_BINDABLE = {h.target: h for h in HOOKS if h.kind in (CLASS_PATH, SETTING, REBINDING)}
_REGISTRIES = {h.target: h for h in HOOKS if h.kind == REGISTRY}


def rows(kind: str, *stages: str) -> list[Hook]:
    return [h for h in HOOKS if h.kind == kind and (not stages or h.stage in stages)]


def features(stage: str | None = None, target: str | None = None) -> list[Hook]:
    """The feature-install rows of ``stage`` and/or ``target``, in table order."""
    return [h for h in HOOKS if h.kind == FEATURE and stage in (None, h.stage) and target in (None, h.target)]


def _check_caller(hook: Hook, frame) -> None:
    caller = f"{frame.f_globals.get('__name__')}:{frame.f_code.co_qualname}"
    if not any(caller == o or caller.startswith(o + ".<locals>.") for o in hook.owners):
        raise HookNotInTable(f"{caller} touches {hook.target}, which vllm_luce/hooks.py gives to "
                             f"{', '.join(hook.owners)}; add the caller to that row")


def bind(target: str, obj: Any, value: Any) -> None:
    """``obj.<attribute> = value`` for a class-path setting, config setting or rebinding row ``target``
    ("module:Class.attribute"); refuses a target without a row or a caller that does not own it."""
    hook = _BINDABLE.get(target)
    if hook is None:
        raise HookNotInTable(f"{target} is not in vllm_luce/hooks.py's table; add a row before binding it")
    _check_caller(hook, sys._getframe(1))
    setattr(obj, target.rsplit(".", 1)[1].split(" (", 1)[0], value)  # a row may name its case in brackets


def register(target: str, *args: Any, **kwargs: Any) -> Any:
    """Call the registry function of row ``target`` ("module:Registry.method") with the arguments."""
    hook = _REGISTRIES.get(target)
    if hook is None or ":" not in target:
        raise HookNotInTable(f"{target} is not a registry in vllm_luce/hooks.py's table")
    _check_caller(hook, sys._getframe(1))
    return resolve(target)(*args, **kwargs)
