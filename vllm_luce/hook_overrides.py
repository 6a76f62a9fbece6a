"""The vLLM methods vllm-luce's subclasses and mixins override: one record each, read into ``hooks.HOOKS`` as its
"subclass override" rows (plain data: this module imports nothing).

A record names the vLLM method (``target``: the class vllm-luce subclasses, where vLLM resolves the name), the
vllm-luce method that overrides it (``owners``), why, how and when it can go, and ``checks``: the target in each
vLLM class the override is mixed into, checked against every supported release's snapshot
(``tests/patches/test_ledger_versions.py``). ``tests/test_hooks.py`` fails on an override without a record.
"""

from __future__ import annotations

SPEC = "vllm.v1.kv_cache_interface:FullAttentionSpec"
MANAGER = "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager"
SCHED, ASYNC_SCHED = "vllm.v1.core.sched.scheduler:Scheduler", "vllm.v1.core.sched.async_scheduler:AsyncScheduler"
KV_SPEC, KV_SCHED = "vllm_luce.kvflash.spec", "vllm_luce.kvflash.scheduler"
GATE, DRAFTER = "vllm_luce.spec_decode.scheduler:DFlashGateMixin", "vllm_luce.spec_decode.drafter"
DFLASH_MODEL = "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM"
# The upstream classes of the executors (architectures.py's EXECUTORS), whose __init__ LuceExecutor wraps.
EXECUTOR_BASES = (
    "vllm.model_executor.models.qwen3_5:Qwen3_5ForCausalLM", "vllm.model_executor.models.qwen3_5:Qwen3_5MoeForCausalLM",
    "vllm.model_executor.models.qwen3_5:Qwen3_5ForConditionalGeneration",
    "vllm.model_executor.models.qwen3_5:Qwen3_5MoeForConditionalGeneration",
    "vllm.model_executor.models.gemma4:Gemma4ForCausalLM",
    "vllm.model_executor.models.gemma4_mm:Gemma4ForConditionalGeneration",
    "vllm.model_executor.models.laguna:LagunaForCausalLM",
)

REGISTERED = ("stays while KVFlash pools: a KV cache spec and its manager, registered through KVCacheSpecRegistry, "
              "are vLLM's own extension point")
KV_SCHEDULER_HOOK = "vLLM offers plugins scheduler hooks (per-request chunk length and admission)"
GATE_HOOK = "vLLM's dynamic speculation takes a runtime provider of the draft length per step and per request"
PASSED_THROUGH = "vLLM's trailing parameters passed through untouched"


def _spec(name: str, why: str, how: str, **extra) -> dict:
    return dict(target=f"{SPEC}.{name}", owners=f"{KV_SPEC}:KVFlashSpec.{name}", feature="KVFlash", why=why, how=how,
                remove_when=REGISTERED, **extra)


def _manager(name: str, why: str, how: str) -> dict:
    return dict(target=f"{MANAGER}.{name}", owners=f"{KV_SPEC}:KVFlashManager.{name}", feature="KVFlash", why=why,
                how=how, remove_when=REGISTERED)


def _scheduler(owner: str, name: str, feature: str, why: str, how: str, remove_when: str) -> dict:
    """A mixin method of vllm-luce's scheduler classes, which subclass both of vLLM's schedulers."""
    return dict(target=f"{SCHED}.{name}", owners=f"{owner}.{name}", feature=feature, why=why, how=how,
                remove_when=remove_when, checks=(f"{SCHED}.{name}", f"{ASYNC_SCHED}.{name}"))


OVERRIDES: tuple[dict, ...] = (
    _spec("max_num_blocks_per_req", "a block-table row holds the pool (with cold rows: a whole context)",
          "the pool's blocks; with cold rows the larger of the pool and a context plus one chunk"),
    _spec("max_memory_usage_bytes", "vLLM's startup check and admission see the pool, not the context, so prompts "
          "beyond the KV budget are admitted", "the pool's blocks times the page size (blocks lent for cold chunks "
          "are free blocks, never required)"),
    _spec("prefix_cacheable", "a pooled block's content depends on paging, not on the prefix",
          "False (vLLM 0.26 has no such property: the prefix-caching setting row covers it there)"),
    _spec("merge", "pooled layers never share a KV cache group with unpooled ones (sliding window, a drafter's "
          "full attention)", "KVFlashMergeError (both AssertionError and ValueError: what vLLM's callers catch) for "
          "mixed specs, pools or cold rows; else vLLM's merge with the pool kept"),
    _manager("supports_fine_grained_hash_lookup", "no prefix-cache lookup into a pooled group", "False"),
    _manager("__init__", "the blocks lent to each request for its cold chunks", "vLLM's __init__, then an empty "
             "luce_lent"),
    _manager("get_num_blocks_to_allocate", "a request needs at most its pool; beyond it, free blocks are lent for "
             "cold chunks and host memory is reserved before the step pages out", "vLLM's count at the capped "
             "length; with luce_admission the blocks lent and a host reservation, or more blocks than exist (vLLM "
             f"holds the request back or preempts it); {PASSED_THROUGH} (0.26 lacks prefill_end)"),
    _manager("allocate_new_blocks", "the pool's blocks plus the ones lent", "vLLM's allocation at the capped length "
             "plus the blocks lent, then the host reservation committed"),
    _manager("free", "the lent blocks and the host reservation go with the request",
             "vLLM's free, then luce_lent and the reservation released"),
    _manager("allocate_external_computed_blocks", "KVFlash takes no KV from a KV connector",
             f"NotImplementedError for external tokens; {PASSED_THROUGH} (0.26 lacks record_for_zeroing)"),
    _manager("find_longest_cache_hit", "no prefix-cache hit in a pooled group", "no blocks, 0 tokens"),
    _manager("cache_blocks", "a pooled block is not a function of its prefix",
             f"caches nothing; {PASSED_THROUGH} (0.26 lacks replay_boundaries)"),
    _manager("remove_skipped_blocks", "paging, not vLLM, decides which of a request's blocks hold what",
             "frees nothing"),
    _manager("get_num_skipped_tokens", "the same", "0"),
    _scheduler(f"{KV_SCHED}:KVFlashSchedulerMixin", "__init__", "KVFlash", "the pool, host admission and the split "
               "flag once vLLM's scheduler exists", "vLLM's __init__; with paged KVFlash, checks "
               "_mamba_block_aligned_split's signature, sets need_mamba_block_aligned_split (its row) and builds "
               "the admission (kvflash/engine_tiers.py)", KV_SCHEDULER_HOOK),
    _scheduler(f"{KV_SCHED}:KVFlashSchedulerMixin", "add_request", "KVFlash", "a request stops where its context "
               "would need more host memory than its share", "lowers Request.max_tokens (its row), then vLLM's "
               "add_request", KV_SCHEDULER_HOOK),
    _scheduler(f"{KV_SCHED}:KVFlashSchedulerMixin", "schedule", "KVFlash", "the host tiers' metrics, and room made "
               "when requests wait for host memory that only this engine's requests hold (the row of Scheduler."
               "running)", "makes that room if the step before needs it, vLLM's schedule, notes whether a holder "
               "ran, then the admission's report", KV_SCHEDULER_HOOK),
    _scheduler(f"{KV_SCHED}:KVFlashSchedulerMixin", "update_from_output", "KVFlash", "the same at a step's end",
               "vLLM's update_from_output, then the report", KV_SCHEDULER_HOOK),
    _scheduler(f"{KV_SCHED}:KVFlashSchedulerMixin", "shutdown", "KVFlash", "no host reservation outlives the "
               "scheduler", "every reservation released, then vLLM's shutdown", KV_SCHEDULER_HOOK),
    _scheduler(GATE, "__init__", "DFlash", "the gate and the lookup that stands in for vLLM's dynamic-speculation "
               "table", "vLLM's __init__, then SpecGate and dynamic_sd_lookup (its row)", GATE_HOOK),
    _scheduler(GATE, "add_request", "DFlash", "a request that declined DFlash (vllm_xargs luce_dflash) never drafts",
               "the gate notes it, then vLLM's add_request", GATE_HOOK),
    _scheduler(GATE, "schedule", "DFlash", "the gate decides K before vLLM schedules and drops drafts nobody may "
               "use", "plans K, empties Request.spec_token_ids (its row) where needed, then vLLM's schedule, timed",
               GATE_HOOK),
    _scheduler(GATE, "update_from_output", "DFlash", "the gate learns each request's acceptance and the step's "
               "cost", "observes the step, then vLLM's update_from_output; forgets finished requests", GATE_HOOK),
    dict(target="vllm.model_executor.models:<upstream model class>.__init__",
         owners="vllm_luce.model_executor.executor:LuceExecutor.__init__", feature="executors",
         why="an executor is vLLM's model, then the layer plan the features attach to",
         how="vLLM's __init__ with vllm_config (and prefix when given, else the upstream default), then LuceConfig, "
             "the LayerPlan and KVFlash's spec binding",
         remove_when="never: executors are vLLM's interface for out-of-tree models (ModelRegistry)",
         checks=tuple(f"{base}.__init__" for base in EXECUTOR_BASES)),
    dict(target=f"{DFLASH_MODEL}.__init__", owners=f"{DRAFTER}:LuceDFlashQwen3ForCausalLM.__init__", feature="DFlash",
         why="the drafter reads luce.dflash's verify settings", how="vLLM's __init__, then the settings",
         remove_when="vLLM's DFlash drafter reports draft confidences and guards non-finite logits"),
    dict(target=f"{DFLASH_MODEL}.compute_logits", owners=f"{DRAFTER}:LuceDFlashQwen3ForCausalLM.compute_logits",
         feature="DFlash", why="draft confidences (adaptive verify width) and the non-finite guard",
         how="vLLM's logits, each row's confidence recorded, non-finite values replaced",
         remove_when="as for its __init__"),
)
