"""What vllm-luce's bindings read of vLLM's objects beside what they bind, as names the hook table's rows check
(``hooks.py``): KVFlash's worker bindings (``kvflash/worker_v1.py``, ``kvflash/worker_v2.py``) and its host admission
(``kvflash/engine_tiers.py``). A rename in a vLLM release then fails the snapshot test
(``tests/patches/test_ledger_versions.py``), not a worker. ``EXPECTED_READS`` is what each is in vLLM 0.32 and
``PER_SERIES_READS`` where another series differs (``hook_signatures.py`` holds them with the other names)."""

from __future__ import annotations

from vllm_luce.source_signatures import ATTRIBUTE

SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
V1_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
V2_RUNNER = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"
V1_BATCH, V1_TABLE = "vllm.v1.worker.gpu_input_batch:InputBatch", "vllm.v1.worker.block_table:BlockTable"
V2_BATCH, V2_TABLES = "vllm.v1.worker.gpu.input_batch:InputBatch", "vllm.v1.worker.gpu.block_table:BlockTables"
V2_STATES = "vllm.v1.worker.gpu.states:RequestState"

KV_READS = ("vllm.config.compilation:CompilationConfig.static_forward_context",
            "vllm.v1.worker.utils:AttentionGroup.backend", "vllm.model_executor.layers.attention:Attention.kv_cache")
KV_V1_READS = (*KV_READS, *(f"{V1_RUNNER}.{n}" for n in ("compilation_config", "input_batch", "attn_groups",
                                                          "kv_cache_config", "query_start_loc", "get_model")),
               *(f"{V1_BATCH}.{n}" for n in ("block_table", "max_num_reqs", "req_ids", "num_computed_tokens_cpu",
                                              "num_prompt_tokens")),
               "vllm.v1.worker.block_table:MultiGroupBlockTable.block_tables",
               *(f"{V1_TABLE}.{n}" for n in ("block_table", "slot_mapping", "block_size")))
KV_V2_READS = (*KV_READS, *(f"{V2_RUNNER}.{n}" for n in ("compilation_config", "block_tables", "attn_groups",
                                                          "req_states", "speculator", "get_model")),
               f"{V2_TABLES}.block_sizes", f"{V2_TABLES}.max_num_reqs",
               # with the scorer policy, a request's token ids come from its state (worker_v2.py)
               *(f"{V2_STATES}.{n}" for n in ("index_to_req_id", "req_id_to_index", "prompt_len", "all_token_ids",
                                               "total_len")),
               *(f"{V2_BATCH}.{n}" for n in ("idx_mapping", "idx_mapping_np", "num_reqs", "req_ids",
                                              "query_start_loc_np", "num_computed_tokens_np")))
KV_SCHEDULER_READS = (*(f"{SCHEDULER}.{n}" for n in ("kv_cache_manager", "kv_cache_config", "vllm_config",
                                                      "num_lookahead_tokens")),
                      "vllm.v1.core.kv_cache_manager:KVCacheManager.coordinator",
                      "vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator.single_type_managers")

_METHODS = {f"{V1_RUNNER}.get_model": "(self) -> nn.Module", f"{V2_RUNNER}.get_model": "(self) -> nn.Module",
            f"{V1_BATCH}.req_ids": "(self) -> list[str]"}  # req_ids: a property of V1's batch
EXPECTED_READS = {name: _METHODS.get(name, ATTRIBUTE) for name in (*KV_V1_READS, *KV_V2_READS, *KV_SCHEDULER_READS)}
# vLLM 0.34 deleted Model Runner V1: its binding never runs there
PER_SERIES_READS = {name: {"0.34": None} for name in KV_V1_READS if name not in KV_READS}
