"""Every way vllm-luce touches vLLM, in one table (``HOOKS``), and the helpers that perform the touches.

A row is one touch: its kind, the vLLM target, the vllm-luce functions, methods or modules that own it (``owners``,
"module:qualname" or a patch module), the feature it serves, why, how, when it can be removed, and ``checks``: the
vLLM names it relies on, each checked against the snapshot of every supported vLLM release
(``tests/patches/test_ledger_versions.py``): a function's signature (the ledger's for a patched target,
``hook_signatures.py``'s for the others), or that a class or attribute exists. Patches add their ledger entry
(``hook_ledger.py``) and the stage at which ``apply_patches`` applies them; feature installs say where vLLM runs
them; subclass overrides are ``hook_overrides.py``'s records.

Nothing binds to vLLM outside this table:

* ``bind(target, obj, value)`` sets an attribute on a vLLM object (a setting, a rebinding or an instance wrap) and
  ``register(target, *args)`` calls a vLLM registry; both refuse a target that has no row, or a caller that is
  not one of the row's owners.
* ``patches.apply_patches`` and ``apply_engine_client_patches`` iterate the patch rows; the VllmConfig
  patch and the ``initialize_kv_cache`` patches run the feature-install rows.
* ``tests/test_hooks.py`` scans vllm_luce/ for attribute stores, ``setattr`` and registry calls that do not go
  through these helpers (attributes named ``luce_*``/``_luce_*`` are vllm-luce's own, on any object), fails on a
  method of a vllm-luce class that overrides a vLLM method without a row, and checks that every owner exists.

docs/vllm_touches.md (the hook table and the patch ledger) is rendered from here
(``python -m tests.test_docs --write-ledger``).

vllm-luce changes vLLM only where a feature or a vLLM bug needs it. The speed-ups of vLLM's CPU backend that only
serve this project's test hosts are not vllm-luce's: they are the test environment's plugin
``testenv/luce_cpu_speedups`` (its own table, ``luce_cpu_speedups.PATCHES``), which scripts/setup.sh installs.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable

from vllm_luce.hook_ledger import LEDGER, LedgerEntry
from vllm_luce.hook_overrides import EXECUTOR_BASES, OVERRIDES
from vllm_luce.hook_reads import KV_SCHEDULER_READS, KV_V1_READS, KV_V2_READS

REGISTRY = "registry"
CLASS_PATH = "class-path setting"
SETTING = "config setting"
REBINDING = "attribute rebinding"
INSTANCE_WRAP = "instance wrap"
PATCH = "patch"
OVERRIDE = "subclass override"
FEATURE = "feature install"
KINDS = (REGISTRY, CLASS_PATH, SETTING, REBINDING, INSTANCE_WRAP, PATCH, OVERRIDE, FEATURE)

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
# The model runner whose objects a row binds (its column in docs/vllm_touches.md): V1 is
# vllm/v1/worker/gpu_model_runner.py and the CPU runner built on it, V2 Model Runner V2 (vllm/v1/worker/gpu/); "" for
# a touch outside the runners (config, scheduler, engine client, model classes, CPU ops). A row of one runner has its
# code in a module named *_v1.py or *_v2.py (tests/test_layout.py).
V1, V2, V1_V2 = "V1", "V2", "V1 and V2"
V1_MODULES = ("vllm.v1.worker.gpu_model_runner.", "vllm.v1.worker.block_table.", "vllm.v1.spec_decode.")
V2_MODULES = ("vllm.v1.worker.gpu.",)


class HookNotInTable(RuntimeError):
    pass


@dataclass(frozen=True)
class Hook:
    kind: str
    target: str
    owners: tuple[str, ...]
    feature: str
    why: str
    how: str
    remove_when: str
    checks: tuple[str, ...]  # vLLM names ("module:qualname") checked against every supported release's snapshot
    stage: str = ""
    ledger: LedgerEntry | None = None
    runner: str = ""  # V1, V2, V1_V2 or "" (above)

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


def runner_of(target: str) -> str:
    """The runner a vLLM target belongs to by its module (V1 or V2), else "" (a row that says nothing else serves
    no runner)."""
    module = target.split(":")[0] + "."
    return V1 if module.startswith(V1_MODULES) else V2 if module.startswith(V2_MODULES) else ""


def _row(kind: str, target: str, owners, feature: str, why: str, how: str, remove_when: str, stage: str = "",
         checks: tuple[str, ...] | None = None, runner: str | None = None) -> Hook:
    """A row; ``runner`` where the target's module does not say it (``runner_of``)."""
    owners = (owners,) if isinstance(owners, str) else tuple(owners)
    return Hook(kind, target, owners, feature, why, how, remove_when, (target,) if checks is None else checks, stage,
                runner=runner_of(target) if runner is None else runner)


def _patch(target: str, feature: str, stage: str, why: str, *also_checked: str) -> Hook:
    e = next(e for e in LEDGER if e.target == target)
    return Hook(PATCH, target, (e.module,), feature, why, e.how, e.remove_when, (target, *also_checked), stage, e,
                runner_of(target))


L, P, X = "vllm_luce", "vllm_luce.patches", "vllm_luce.model_executor"
KV, SD, PF = "vllm_luce.kvflash", "vllm_luce.spec_decode", "vllm_luce.pflash"
V026 = "vllm_luce.vllm026"  # vLLM 0.26 only: every row that names it goes with 0.26 (vllm_luce/vllm026/__init__.py)
SCHED_CONFIG, ENGINE_ARGS = "vllm.config.scheduler:SchedulerConfig", "vllm.engine.arg_utils:EngineArgs"
SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
V1_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
V2_RUNNER = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"
V2_TABLES, SPECULATOR = "vllm.v1.worker.gpu.block_table:BlockTables", \
    "vllm.v1.worker.gpu.spec_decode.dflash.speculator:DFlashSpeculator"
DFLASH_MODEL, BUILDER = "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM", \
    "vllm.v1.attention.backend:AttentionMetadataBuilder"
PLUGINS = ("vllm.plugins:load_general_plugins", "vllm.plugins:DEFAULT_PLUGINS_GROUP")
# What KVFlash's binding probes the CPU backend's KV layout with (kvflash/cache_layout.py): the kernel, in
# vllm._custom_ops before vLLM 0.34 and vllm._cpu_ops from it, and the kernel ISA it picks.
CPU_LAYOUT = ("vllm._custom_ops:cpu_attn_reshape_and_cache", "vllm._cpu_ops:cpu_attn_reshape_and_cache",
              "vllm.v1.attention.backends.cpu_attn:_get_attn_isa")

# The classes vllm-luce sets as vLLM's scheduler_cls, by async_scheduling: the DFlash gate's (composed with KVFlash's
# mixin in vllm_luce/schedulers.py, so the gate may replace KVFlash's) and KVFlash's alone (kvflash/scheduler.py).
SCHEDULER_CLS = f"{SCHED_CONFIG}.scheduler_cls"
GATED_SCHEDULERS = {False: f"{L}.schedulers.LuceGatedScheduler", True: f"{L}.schedulers.LuceGatedAsyncScheduler"}
KVFLASH_SCHEDULERS = {False: f"{KV}.scheduler.LuceKVFlashScheduler", True: f"{KV}.scheduler.LuceKVFlashAsyncScheduler"}
VLLM_DEFAULT_SCHEDULERS = (None, "vllm.v1.core.sched.scheduler.Scheduler",
                           "vllm.v1.core.sched.async_scheduler.AsyncScheduler")

# Removal conditions several rows share.
NEVER = "never: vLLM's own extension point"
KV_WORKER_HOOK = ("vLLM offers a worker-side hook for a custom KV cache spec to own its slot mapping, attention "
                  "metadata and request lifecycle")
GATE_HOOK = "vLLM's dynamic speculation takes a runtime provider of the draft length per step and per request"
KV_SCHEDULER_HOOK = "vLLM offers plugins scheduler hooks (per-request chunk length and admission)"
WITH_SPEC_PATCH = "with the create_speculative_config patch (vLLM resolves drafters itself)"
V2_PLAIN_STEPS = "vLLM's Model Runner V2 skips the drafter's forward on a step that asks for no drafts"
STASH_026 = "vllm-luce drops vLLM 0.26 (the context stash serves 0.26 only)"
STATE_026 = "vllm-luce drops vLLM 0.26 (from 0.32 a decode row without drafts takes the verify path)"

# Each ledger entry's feature, stage, purpose and any other vLLM name it relies on (the ledger holds signatures,
# how and removal condition).
PATCHES: dict[str, tuple[str, ...]] = {
    "vllm.config.vllm:VllmConfig.__post_init__": (
        "config", STARTUP, "validate and resolve `--additional-config {\"luce\": ...}` before vLLM's checks, for "
        "every process; run the feature installs; log the active features"),
    f"{ENGINE_ARGS}.add_cli_args": ("DFlash", STARTUP, "`--speculative-model`; strict `--additional-config`"),
    f"{ENGINE_ARGS}.create_speculative_config": ("DFlash", STARTUP,
                                                 "drafter resolution, defaults and drafter/target checks"),
    "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention:_spec_forward": (
        "DFlash", ON_IMPORT, "CPU (vLLM bug): variable draft counts on hybrid (GDN) targets"),
    "vllm._custom_ops:fused_sigmoid_gating_delta_rule_update_cpu": (
        "DFlash", ON_IMPORT, "CPU (vLLM bug): unit-stride inputs for the GDN decode of a step without spec rows"),
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner.take_draft_token_ids": (
        "DFlash", ON_IMPORT, "cut each request's drafts to its verify width"),
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs": (
        "DFlash", ON_IMPORT, "(vLLM bug) a hybrid target's state for a row back after a step away or, on 0.26, "
        "decoding without drafts"),
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states_after_model_execute": (
        "DFlash", ON_IMPORT, "each request's kept tokens, for the row above"),
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner._may_reorder_batch": (
        "DFlash", ON_IMPORT, "(vLLM 0.26 bug) a hybrid target's verifying rows ahead of the rows without drafts, "
        "whose gates vLLM 0.26 gives them otherwise"),
    "vllm.v1.spec_decode.dflash:DFlashProposer.propose": (
        "DFlash", ON_IMPORT, "on the gate's plain steps run only the drafter's context pass"),
    "vllm._custom_ops:rms_norm": (
        "DFlash", ON_IMPORT, "CPU (vLLM bug): DFlash drafters' grouped (per-layer) norm weights"),
    "vllm.utils.cpu_triton_utils:_expand_kernel_impl": (
        "DFlash", ON_IMPORT,
        "CPU (vLLM bug): per-request sampling values in the rejection sampler (vLLM's were unwritten)"),
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner.initialize_kv_cache": (
        "KVFlash; PFlash", ON_IMPORT, "run the worker-side feature installs once the KV cache exists"),
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.initialize_kv_cache": (
        "KVFlash; PFlash", ON_IMPORT, "the same"),
    "vllm.v1.core.sched.scheduler:Scheduler._mamba_block_aligned_split": (
        "KVFlash", SCHEDULER_START, "a paged request's steps end at its decision positions",
        "vllm.v1.core.sched.async_scheduler:AsyncScheduler._mamba_block_aligned_split",
        "vllm.v1.request:Request.num_output_placeholders"),
    "vllm.v1.engine.async_llm:AsyncLLM.add_request": (
        "PFlash; DFlash; KVFlash", ENGINE_CLIENT, "check per-request switches (an HTTP 400); compress eligible "
        "prompts; refuse a prompt beyond KVFlash's host share (an HTTP 400)"),
    "vllm.v1.engine.llm_engine:LLMEngine.add_request": ("PFlash; DFlash; KVFlash", ENGINE_CLIENT,
                                                        "the same for the offline LLM API"),
    "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest.to_sampling_params": (
        "PFlash", ENGINE_CLIENT_PFLASH, "mark tool and response-format requests, never compressed"),
    f"{ENGINE_ARGS}.from_cli_args": ("PFlash", STARTUP, "with PFlash on, add the usage middleware to `--middleware`"),
    "vllm._cpu_ops:fused_sigmoid_gating_delta_rule_update_cpu": (
        "DFlash", ON_IMPORT, "the same on vLLM 0.34, whose CPU ops moved to vllm._cpu_ops"),
    "vllm.v1.worker.gpu_worker:Worker.extend_kv_cache": (
        "KVFlash; PFlash", ON_IMPORT, "free the features' device budget once vLLM 0.34 has sized the KV cache",
        "vllm.v1.worker.gpu_worker:Worker.model_runner", f"{V2_RUNNER}.kv_cache_config", f"{V2_RUNNER}.device"),
}

HOOKS: tuple[Hook, ...] = (
    # registries
    _row(REGISTRY, "entry point vllm.general_plugins: luce", f"{L}:register", "all",
         "vLLM calls register() in every process (pyproject.toml); everything below starts there",
         "pyproject.toml's entry point, which vLLM's load_general_plugins runs before it builds anything", NEVER,
         checks=PLUGINS),
    _row(REGISTRY, "vllm.model_executor.models:ModelRegistry.register_model",
         (f"{X}.registry:register_executors", f"{X}.registry:register_drafters"), "executors; DFlash",
         "the Luce executors under the upstream architecture names (lazy \"module:Class\"); the DFlash "
         "drafter class for DFlashDraftModel (non-finite guard, draft confidences)",
         "lazy \"module:Class\" strings, imported when vLLM builds that architecture", NEVER,
         checks=("vllm.model_executor.models:ModelRegistry",
                 "vllm.model_executor.models.registry:_ModelRegistry.register_model")),
    _row(REGISTRY, "vllm.v1.kv_cache_spec_registry:KVCacheSpecRegistry._ensure_registered", f"{KV}.spec:_register",
         "KVFlash", "private: vLLM fills its built-in specs only while the registry is empty, so they go first",
         "called once, right before register", "vLLM registers its built-in specs whatever registers first"),
    _row(REGISTRY, "vllm.v1.kv_cache_spec_registry:KVCacheSpecRegistry.register", f"{KV}.spec:_register",
         "KVFlash", "KVFlashSpec (per-request pool) and KVFlashManager, a group type of their own",
         "at kvflash/spec.py's import, with uniform_type_base_spec=KVFlashSpec", NEVER),
    _row(REGISTRY, "prometheus_client:REGISTRY.register", "vllm_luce.metrics:install", "metrics",
         "the vllm:luce_* collector in the default registry vLLM serves at /metrics and LLM.get_metrics() reads",
         "a collector (metrics/collector.py) that reads what every process wrote", NEVER,
         checks=("vllm.v1.metrics.prometheus:get_prometheus_registry",)),
    # class-path settings
    _row(CLASS_PATH, SCHEDULER_CLS, (f"{SD}.install:install_gate", f"{KV}.install:_install_scheduler"),
         "DFlash; KVFlash", "the gated scheduler when vLLM speculates with DFlash; else KVFlash's scheduler "
         "(a pooled prompt's last token in a step of its own). Another user class stops startup",
         "after vLLM's checks: the sync or async class, following async_scheduling",
         "vLLM composes plugins' scheduler hooks (a draft-length provider, per-request chunking and admission)"),
    _row(CLASS_PATH, "vllm.config.parallel:ParallelConfig.worker_extension_cls", f"{PF}.install:_install_worker_extension",
         "PFlash", "PFlash's scorer method on the worker, reached by collective_rpc",
         "after vLLM's checks: pflash.worker:PFlashWorkerExtension; a user's own extension stops startup", NEVER),
    _row(CLASS_PATH, "argparse:Namespace.middleware (vLLM's --middleware)",
         f"{P}.engine_args_from_cli:add_usage_middleware", "PFlash",
         "pflash.usage_report.UsageMiddleware: each completions and chat response's usage.luce_pflash says what "
         "PFlash did to its prompts",
         "appended to the parsed list after the user's own, with PFlash on, in the from_cli_args patch; vLLM adds "
         "it to its app", "vLLM lets a plugin add fields to a response's usage",
         checks=("vllm.entrypoints.openai.cli_args:FrontendArgs.middleware",
                 "vllm.entrypoints.launchers.cli_args:FrontendArgs.middleware",
                 "vllm.entrypoints.common.cli_args:FrontendArgs.middleware")),
    # config settings
    _row(SETTING, "vllm.config.cache:CacheConfig.enable_prefix_caching", f"{KV}.install:before_vllm_checks",
         "KVFlash", "off: a pooled request's KV is not a function of its prefix (before vLLM's checks, which size "
         "Mamba blocks from it)", "False, with a warning where the user set it",
         "vLLM lets one KV cache group opt out of prefix caching while the others keep it"),
    _row(SETTING, f"{SCHED_CONFIG}.max_num_scheduled_tokens", f"{KV}.install:install_kvflash", "KVFlash",
         "a step's new tokens must fit a request's pool beside the sinks", "lowered to that, with a warning",
         "never while KVFlash pools"),
    _row(SETTING, f"{SCHED_CONFIG}.long_prefill_token_threshold", f"{KV}.install:install_kvflash", "KVFlash",
         "the same cap per request", "set where unset or higher, with a warning", "never while KVFlash pools"),
    _row(SETTING, f"{ENGINE_ARGS}.spec_model", f"{P}.engine_args:apply_dflash_defaults", "DFlash",
         "`--speculative-model dflash` resolved to the drafter's path", "in the create_speculative_config patch",
         WITH_SPEC_PATCH),
    _row(SETTING, f"{ENGINE_ARGS}.spec_method", f"{P}.engine_args:apply_dflash_defaults", "DFlash",
         "'dflash' where the user left it unset", "the same", WITH_SPEC_PATCH),
    _row(SETTING, f"{ENGINE_ARGS}.spec_tokens", f"{P}.engine_args:apply_dflash_defaults", "DFlash",
         "the drafter's block size - 1 where the user left it unset", "the same", WITH_SPEC_PATCH),
    _row(SETTING, f"{ENGINE_ARGS}.speculative_config", f"{P}.engine_args:apply_dflash_defaults", "DFlash",
         "the same defaults for `--speculative-config`", "the user's dict with the defaults filled", WITH_SPEC_PATCH),
    _row(SETTING, f"{ENGINE_ARGS}.max_num_seqs", f"{P}.engine_args:fit_draft_slots", "DFlash",
         "where unset and vLLM's defaults leave no room for DFlash's draft slots in the step's token budget",
         "the largest power of two whose slots take at most half the budget, with a warning",
         "vLLM sizes max_num_seqs for the draft slots itself"),
    _row(SETTING, "vllm.sampling_params:SamplingParams.extra_args",
         (f"{P}.chat_completion_request:_make_wrapper", f"{KV}.frontend:mark_family"), "PFlash, KVFlash",
         "luce_pflash_skip: a tool or response-format request is never compressed; luce_kvflash_family: the n "
         "samples of one request split one share of host memory (vLLM's children share one params' extra_args, "
         "which the scheduler reads)",
         "the request's own dict with luce_pflash_skip added, in the to_sampling_params patch; luce_kvflash_family "
         "= n set (a client's value cleared) before vLLM's add_request",
         "with that patch; the family: when vLLM's scheduler knows a child request's parent"),
    _row(SETTING, "vllm.config.speculative:SpeculativeConfig.num_speculative_tokens_per_batch_size",
         f"{SD}.plain_steps_v2:set_graph_table", "DFlash",
         "on CUDA: draft lengths K and 0, so vLLM captures one-token decode graphs for the gate's plain steps",
         "set at install where no table was (a user's table is refused)",
         "vLLM captures K = 0 graphs for dynamic speculation itself", runner=V2,
         checks=("vllm.config.speculative:SpeculativeConfig.num_speculative_tokens_per_batch_size",
                 "vllm.config.vllm:VllmConfig.use_v2_model_runner")),
    # attribute rebindings (instance attributes of one scheduler, request or group, unless said otherwise)
    _row(REBINDING, "vllm.model_executor.models:<upstream model class>.__name__",
         f"{X}.executor:LuceExecutor.__init_subclass__", "executors",
         "on each Luce executor class: vLLM dispatches on model.__class__.__name__",
         "the upstream class's name; the executor's own stays in __qualname__",
         "vLLM dispatches on the registered architecture, not the class name", checks=EXECUTOR_BASES),
    _row(REBINDING, f"{SCHEDULER}.dynamic_sd_lookup", f"{SD}.scheduler:DFlashGateMixin.__init__",
         "DFlash", "the gate stands in for vLLM's dynamic-speculation table: K or 0 each step",
         "a GatedLookup that answers lookup[batch_size] with the K the gate planned", GATE_HOOK),
    _row(REBINDING, "vllm.v1.request:Request.spec_token_ids", f"{SD}.scheduler:DFlashGateMixin.schedule", "DFlash",
         "emptied for a request that may not use its drafts this step (plain step, stopped or declined)",
         "[] before vLLM schedules the step", GATE_HOOK),
    _row(REBINDING, f"{SCHEDULER}.need_mamba_block_aligned_split",
         f"{KV}.scheduler:KVFlashSchedulerMixin.__init__", "KVFlash",
         "so vLLM calls _mamba_block_aligned_split, the override that ends a paged request's steps at its decision "
         "positions",
         "True on the scheduler, with paged KVFlash; the same __init__ builds KVFlash's host admission from the "
         "scheduler's KV cache managers (kvflash/engine_tiers.py)", KV_SCHEDULER_HOOK,
         checks=(f"{SCHEDULER}.need_mamba_block_aligned_split", *KV_SCHEDULER_READS)),
    _row(REBINDING, f"{SCHEDULER}.running", f"{KV}.scheduler:KVFlashSchedulerMixin._luce_make_host_room", "KVFlash",
         "requests that wait for host memory only this engine's own requests hold, none of which ran in the step "
         "before, would wait for ever: one holder is preempted, the one vLLM would preempt first (FCFS: the last "
         "running; priority: the largest priority and arrival time), unless it is the only one waiting",
         "removed from Scheduler.running and preempted with vLLM's own _preempt_request, which frees its blocks "
         "(and so its host reservation) and tells the workers in this step's output; whether a holder ran is read "
         "from SchedulerOutput.num_scheduled_tokens", KV_SCHEDULER_HOOK,
         checks=(f"{SCHEDULER}.running", f"{SCHEDULER}._preempt_request", f"{SCHEDULER}.policy",
                 "vllm.v1.request:Request.priority", "vllm.v1.request:Request.arrival_time",
                 "vllm.v1.core.sched.output:SchedulerOutput.num_scheduled_tokens")),
    _row(REBINDING, f"{SCHEDULER}.grammar_compile_error_reqs", f"{KV}.scheduler:KVFlashSchedulerMixin._luce_fail",
         "KVFlash", "a request that waited for host memory longer than luce.kvflash.host_wait_s, or asks for more "
         "than host_request_bytes, ends with an error (a bounded wait) instead of waiting for ever",
         "its id added to the requests vLLM ends with FINISHED_ERROR at the end of update_from_output (a set in "
         "0.26-0.32: the client gets vLLM's internal error; a dict of RequestError from 0.33: the client gets our "
         "message); the server log names the setting either way", KV_SCHEDULER_HOOK,
         checks=(f"{SCHEDULER}.grammar_compile_error_reqs", "vllm.outputs:RequestError")),
    _row(REBINDING, "vllm.v1.core.sched.output:SchedulerOutput.luce_cold_rows",
         f"{KV}.scheduler:KVFlashSchedulerMixin.schedule", "KVFlash",
         "the workers learn which requests gave lent KV blocks back this step, to move the cold chunks there out "
         "before the blocks change hands (vLLM's output only ever appends blocks to a running request's row)",
         "a new attribute on the step's output: request -> its row's length in blocks; taken back when requests "
         "were left waiting (Scheduler.waiting) with sequences (max_num_running_reqs) and tokens "
         "(max_num_scheduled_tokens, the output's total_num_scheduled_tokens) to spare", KV_SCHEDULER_HOOK,
         checks=("vllm.v1.core.sched.output:SchedulerOutput", f"{SCHEDULER}.waiting",
                 f"{SCHEDULER}.max_num_running_reqs", f"{SCHEDULER}.running", f"{SCHEDULER}.max_num_scheduled_tokens",
                 "vllm.v1.core.sched.output:SchedulerOutput.total_num_scheduled_tokens")),
    _row(REBINDING, "vllm.v1.request:Request.max_tokens", f"{KV}.scheduler:KVFlashSchedulerMixin.add_request",
         "KVFlash", "a request stops (finish reason length) where its context would need more host memory than "
         "luce.kvflash.host_request_bytes, as at max_model_len", "lowered before vLLM's add_request",
         "vLLM bounds a request's length by a plugin's limit, as by max_model_len"),
    _row(REBINDING, "vllm.v1.worker.utils:AttentionGroup.metadata_builders",
         (f"{KV}.worker_v1:bind_v1", f"{KV}.worker_v2:bind_v2"), "KVFlash",
         "wrapped builders: attention reads the resident tokens only",
         "each builder of the pooled group behind a proxy whose build, build_for_cudagraph_capture and "
         "build_for_drafting see seq_lens = resident tokens", KV_WORKER_HOOK,
         checks=("vllm.v1.worker.utils:AttentionGroup.metadata_builders", f"{BUILDER}.build",
                 f"{BUILDER}.build_for_cudagraph_capture", f"{BUILDER}.build_for_drafting"), runner=V1_V2),
    _row(REBINDING, "argparse:Action.type (vLLM's --additional-config)", f"{P}.engine_args:_make_add_cli_args",
         "config", "--additional-config parsed strictly as a JSON object",
         "the action's type, in the add_cli_args patch", "vLLM parses --additional-config as a JSON object strictly",
         checks=(f"{ENGINE_ARGS}.additional_config",)),
    # instance wraps: a vLLM method replaced on one object by a function that calls the original bound method
    _row(INSTANCE_WRAP, "vllm.model_executor.layers.attention:Attention.get_kv_cache_spec",
         f"{X}.executor:pool_full_attention", "KVFlash",
         "the full-attention layers that own their KV declare a KVFlashSpec",
         "vLLM's spec of the layer, as a KVFlashSpec with the pool", "vLLM lets a model choose a layer's spec type"),
    _row(INSTANCE_WRAP, "vllm.v1.worker.block_table:BlockTable.compute_slot_mapping",
         f"{KV}.worker_v1:_bind_slot_mapping", "KVFlash",
         "the pooled group's slots come from the pagers instead of row[pos // block]",
         "the pooled group's block table only; the other groups keep vLLM's", KV_WORKER_HOOK),
    _row(INSTANCE_WRAP, "vllm.v1.attention.backend:AttentionImpl.forward", f"{KV}.worker:capture_queries", "KVFlash",
         "the pooled layers' queries, observed for the QK policy",
         "notes each request's last query, then vLLM's forward", KV_WORKER_HOOK, runner=V1_V2),
    _row(INSTANCE_WRAP, f"{V1_RUNNER}._update_states", f"{KV}.worker_v1:_bind_release",
         "KVFlash", "finished and preempted requests release their pagers; rows the scheduler cut (lent blocks taken "
         "back, SchedulerOutput.luce_cold_rows) move their cold chunks out and end at the cut",
         "the releases and the cuts (the pooled BlockTable's num_blocks_per_row and the request state's block_ids "
         "shortened), then vLLM's _update_states", KV_WORKER_HOOK,
         checks=(f"{V1_RUNNER}._update_states", "vllm.v1.worker.block_table:BlockTable.num_blocks_per_row",
                 "vllm.v1.worker.gpu_input_batch:CachedRequestState.block_ids", f"{V1_RUNNER}.requests",
                 "vllm.v1.worker.gpu_input_batch:InputBatch.req_id_to_index")),
    _row(INSTANCE_WRAP, f"{V2_TABLES}.append_block_ids", f"{KV}.worker_v2:bind_v2",
         "KVFlash", "the pooled group's block rows mirrored on the host for the pagers",
         "vLLM's, then the pooled rows copied to the mirror", KV_WORKER_HOOK),
    _row(INSTANCE_WRAP, f"{V2_TABLES}.compute_slot_mappings", f"{KV}.worker_v2:bind_v2",
         "KVFlash", "the pooled group's row of slots from the pagers",
         "vLLM's for the other groups, the pagers' for the pooled one", KV_WORKER_HOOK),
    _row(INSTANCE_WRAP, f"{V2_RUNNER}.finish_requests", f"{KV}.worker_v2:bind_v2",
         "KVFlash", "as V1's _update_states row, on Model Runner V2",
         "the releases and the cuts (the pooled group's BlockTables.num_blocks shortened), then vLLM's "
         "finish_requests", KV_WORKER_HOOK,
         checks=(f"{V2_RUNNER}.finish_requests", f"{V2_TABLES}.num_blocks")),
    _row(INSTANCE_WRAP, f"{V2_RUNNER}.prepare_attn", f"{KV}.worker_v2:bind_v2",
         "KVFlash", "the step's InputBatch noted, whose host mirrors the pooled slot mapping reads",
         "notes the batch, then vLLM's prepare_attn", KV_WORKER_HOOK),
    _row(INSTANCE_WRAP, f"{V2_RUNNER}.execute_model", f"{SD}.plain_steps_v2:bind_v2",
         "DFlash", "note whether the step's scheduler output asked for drafts",
         "notes the step (and runs what vLLM 0.26's context stash set to run first), then vLLM's execute_model",
         V2_PLAIN_STEPS),
    _row(INSTANCE_WRAP, f"{SPECULATOR}._generate_draft", f"{SD}.plain_steps_v2:bind_v2", "DFlash",
         "no drafter forward on a plain step (eager)", "vLLM's, except on a plain step", V2_PLAIN_STEPS),
    _row(INSTANCE_WRAP, "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager.run_fullgraph", f"{SD}.plain_steps_v2:bind_v2",
         "DFlash", "no drafter forward on a plain step (graph replay; the drafter's graph manager only)",
         "vLLM's replay, except on a plain step, where from vLLM 0.32 the speculator's _prepare_graph_forward (the "
         "graph's context write) runs eagerly instead", V2_PLAIN_STEPS,
         checks=("vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager.run_fullgraph",
                 f"{SPECULATOR}._prepare_graph_forward")),
    _row(INSTANCE_WRAP, f"{DFLASH_MODEL}.combine_hidden_states", f"{V026}.context_stash_v2:bind_context_stash",
         "DFlash", "vLLM 0.26 (plain_context_stash, on by default there): a stashable plain step's features held "
         "instead of projected", "stages the features, or vLLM's projection", STASH_026, runner=V2),
    _row(INSTANCE_WRAP, f"{DFLASH_MODEL}.precompute_and_store_context_kv",
         f"{V026}.context_stash_v2:bind_context_stash",
         "DFlash", "vLLM 0.26 (plain_context_stash): held context written in one pass before any other "
         "context write", "commits or writes what the stash holds, then vLLM's write", STASH_026, runner=V2),
    _row(INSTANCE_WRAP, "vllm.v1.worker.gpu.model_states.mamba_hybrid:MambaHybridModelState.preprocess_state",
         f"{V026}.recurrent_state_v2:bind_v2", "DFlash", "(vLLM 0.26 bug) a hybrid target's decode row without "
         "drafts after its request's verify step reads the Gated DeltaNet state of that step's first token",
         "moves those rows' states to slot 0 and their kept count to 1, then vLLM's", STATE_026),
    # patches: one row per ledger entry, in the ledger's order (PATCHES above)
) + tuple(_patch(e.target, *PATCHES[e.target]) for e in LEDGER) + tuple(
    # subclass overrides (hook_overrides.py)
    _row(OVERRIDE, **record) for record in OVERRIDES
) + (
    # feature installs (run in table order)
    _row(FEATURE, "vllm.config.vllm:VllmConfig.__post_init__", f"{KV}.install:before_vllm_checks", "KVFlash",
         "settings vLLM's own checks must see (prefix caching)", "called by the VllmConfig patch with LuceConfig",
         "with the VllmConfig patch", BEFORE_CHECKS),
    _row(FEATURE, "vllm.config.vllm:VllmConfig.__post_init__", f"{SD}.install:install_gate", "DFlash",
         "the DFlash gate's scheduler class", "the same", "with the VllmConfig patch", AFTER_CHECKS),
    _row(FEATURE, "vllm.config.vllm:VllmConfig.__post_init__", f"{V026}.context_stash_v2:check_setting", "DFlash",
         "vLLM 0.26 (plain_context_stash): a number of tokens where the stash cannot apply stops startup", "the same",
         STASH_026, AFTER_CHECKS, runner=V2),
    _row(FEATURE, "vllm.config.vllm:VllmConfig.__post_init__", f"{KV}.install:install_kvflash", "KVFlash",
         "validate the pool; scheduler class and step caps", "the same", "with the VllmConfig patch", AFTER_CHECKS),
    _row(FEATURE, "vllm.config.vllm:VllmConfig.__post_init__", f"{PF}.install:install_pflash", "PFlash",
         "check the drafter (no weights loaded); the worker extension", "the same", "with the VllmConfig patch",
         AFTER_CHECKS),
    _row(FEATURE, f"{V1_RUNNER}.initialize_kv_cache", f"{KV}.worker_v1:bind_v1", "KVFlash",
         "bind the pagers to the runner's KV cache, block table, builders and layers",
         "called by the initialize_kv_cache patch with the runner and LuceConfig", KV_WORKER_HOOK, KV_CACHE_V1,
         checks=(f"{V1_RUNNER}.initialize_kv_cache", *CPU_LAYOUT, *KV_V1_READS)),
    _row(FEATURE, f"{V2_RUNNER}.initialize_kv_cache", f"{KV}.worker_v2:bind_v2", "KVFlash",
         "the same", "the same", KV_WORKER_HOOK, KV_CACHE_V2,
         checks=(f"{V2_RUNNER}.initialize_kv_cache", *CPU_LAYOUT, *KV_V2_READS)),
    _row(FEATURE, f"{V2_RUNNER}.initialize_kv_cache", f"{SD}.plain_steps_v2:bind_v2", "DFlash",
         "plain steps write the drafter's context and skip its forward", "the same", V2_PLAIN_STEPS, KV_CACHE_V2),
    _row(FEATURE, f"{V2_RUNNER}.initialize_kv_cache", f"{V026}.context_stash_v2:bind_v2", "DFlash",
         "vLLM 0.26 (plain_context_stash, on by default there): plain steps hold the drafter's context inputs",
         "the same, after the plain steps' binding", STASH_026, KV_CACHE_V2),
    _row(FEATURE, f"{V2_RUNNER}.initialize_kv_cache", f"{V026}.recurrent_state_v2:bind_v2", "DFlash",
         "vLLM 0.26, speculating on a hybrid target: the model state's preprocess_state moves the state of a decode "
         "row without drafts after a verify step", "the same", STATE_026, KV_CACHE_V2),
    _row(FEATURE, "GPUModelRunner.initialize_kv_cache (V1 and V2)", f"{PF}.worker:bind", "PFlash",
         "load the PFlash drafter on rank 0 (after the KV cache: a drafter that cannot load stops startup)",
         "the same, on either runner", "vLLM offers a worker-side hook after the KV cache is allocated",
         KV_CACHE_BOTH, checks=(f"{V1_RUNNER}.initialize_kv_cache", f"{V2_RUNNER}.initialize_kv_cache"), runner=V1_V2),
    _row(FEATURE, "GPUModelRunner.initialize_kv_cache (V1 and V2)", f"{L}.scorer_policy:bind", "KVFlash",
         "policy 'scorer': PFlash's drafter attached as KVFlash's chunk scorer, once both features are bound (the "
         "seam's row follows theirs)", "the same, on either runner", "never: where two features meet",
         KV_CACHE_BOTH, checks=(f"{V1_RUNNER}.initialize_kv_cache", f"{V2_RUNNER}.initialize_kv_cache"), runner=V1_V2),
    _row(FEATURE, "vllm_luce:register", "vllm_luce.metrics:install", "metrics",
         "the metrics directory and collector", "called by register()", NEVER, AT_REGISTER, checks=PLUGINS),
)

_BINDABLE = {h.target: h for h in HOOKS if h.kind in (CLASS_PATH, SETTING, REBINDING, INSTANCE_WRAP)}
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
    """``obj.<attribute> = value`` for a class-path setting, config setting, rebinding or instance-wrap row ``target``
    ("module:Class.attribute"); refuses a target without a row, a caller that does not own it, and a method replaced
    through a row that is no instance wrap (whose row checks the method's signature in every supported release)."""
    hook = _BINDABLE.get(target)
    if hook is None:
        raise HookNotInTable(f"{target} is not in vllm_luce/hooks.py's table; add a row before binding it")
    _check_caller(hook, sys._getframe(1))
    name = target.rsplit(".", 1)[1].split(" (", 1)[0]  # a row may name its case in brackets
    if hook.kind == INSTANCE_WRAP and not callable(value):
        raise HookNotInTable(f"{target} is an instance-wrap row: bind a function that wraps vLLM's method")
    if hook.kind != INSTANCE_WRAP and inspect.ismethod(getattr(obj, name, None)):
        raise HookNotInTable(f"{target} replaces a method: make its row an instance wrap, with the signature checked")
    setattr(obj, name, value)


def register(target: str, *args: Any, **kwargs: Any) -> Any:
    """Call the registry function of row ``target`` ("module:Registry.method") with the arguments."""
    hook = _REGISTRIES.get(target)
    if hook is None or ":" not in target:
        raise HookNotInTable(f"{target} is not a registry in vllm_luce/hooks.py's table")
    _check_caller(hook, sys._getframe(1))
    return resolve(target)(*args, **kwargs)
