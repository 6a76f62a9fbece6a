"""What each vLLM name the hook table relies on is, per supported vLLM series, apart from the patched targets
(their signatures are the ledger's, ``hook_ledger.py``): a function's signature as ``source_signatures`` reads
source, ``CLASS``, or ``ATTRIBUTE`` (assigned in the class body or as ``self.name`` in a method).

``tests/patches/test_ledger_versions.py`` checks every name of every row's ``checks`` against the snapshot of each
supported release (``scripts/vllm_signatures.py`` writes them). When a new vLLM release changes one, review the rows
that rely on it before recording the new value here.
"""

from __future__ import annotations

from vllm_luce.hook_reads import EXPECTED_READS, PER_SERIES_READS
from vllm_luce.source_signatures import ATTRIBUTE, CLASS

# name -> what it is in vLLM 0.32
EXPECTED: dict[str, str] = {
    **EXPECTED_READS,
    "vllm.plugins:load_general_plugins":
        '()',
    "vllm.plugins:DEFAULT_PLUGINS_GROUP":
        ATTRIBUTE,
    "vllm.model_executor.models:ModelRegistry":
        ATTRIBUTE,
    "vllm.model_executor.models.registry:_ModelRegistry.register_model":
        '(self, model_arch: str, model_cls: type[nn.Module] | str) -> None',
    "vllm.v1.kv_cache_spec_registry:KVCacheSpecRegistry._ensure_registered":
        '(cls, vllm_config=None) -> None',
    "vllm.v1.kv_cache_spec_registry:KVCacheSpecRegistry.register":
        "(cls, kvcache_spec_cls: type['KVCacheSpec'], manager_class: type['SingleTypeKVCacheManager'] | None=None, "
        "uniform_type_base_spec: type['KVCacheSpec'] | None=None) -> None",
    "vllm.v1.metrics.prometheus:get_prometheus_registry":
        '() -> CollectorRegistry',
    "vllm.config.scheduler:SchedulerConfig.scheduler_cls":
        ATTRIBUTE,
    "vllm.config.parallel:ParallelConfig.worker_extension_cls":
        ATTRIBUTE,
    "vllm.entrypoints.openai.cli_args:FrontendArgs.middleware":
        ATTRIBUTE,
    "vllm.entrypoints.launchers.cli_args:FrontendArgs.middleware":
        ATTRIBUTE,
    "vllm.entrypoints.common.cli_args:FrontendArgs.middleware":
        ATTRIBUTE,
    "vllm.config.cache:CacheConfig.enable_prefix_caching":
        ATTRIBUTE,
    "vllm.config.scheduler:SchedulerConfig.max_num_scheduled_tokens":
        ATTRIBUTE,
    "vllm.config.scheduler:SchedulerConfig.long_prefill_token_threshold":
        ATTRIBUTE,
    "vllm.engine.arg_utils:EngineArgs.spec_model":
        ATTRIBUTE,
    "vllm.engine.arg_utils:EngineArgs.spec_method":
        ATTRIBUTE,
    "vllm.engine.arg_utils:EngineArgs.spec_tokens":
        ATTRIBUTE,
    "vllm.engine.arg_utils:EngineArgs.speculative_config":
        ATTRIBUTE,
    "vllm.engine.arg_utils:EngineArgs.max_num_seqs":
        ATTRIBUTE,
    "vllm.sampling_params:SamplingParams.extra_args":
        ATTRIBUTE,
    "vllm.config.speculative:SpeculativeConfig.num_speculative_tokens_per_batch_size":
        ATTRIBUTE,
    "vllm.model_executor.models.qwen3_5:Qwen3_5ForCausalLM":
        CLASS,
    "vllm.model_executor.models.qwen3_5:Qwen3_5MoeForCausalLM":
        CLASS,
    "vllm.model_executor.models.qwen3_5:Qwen3_5ForConditionalGeneration":
        CLASS,
    "vllm.model_executor.models.qwen3_5:Qwen3_5MoeForConditionalGeneration":
        CLASS,
    "vllm.model_executor.models.gemma4:Gemma4ForCausalLM":
        CLASS,
    "vllm.model_executor.models.gemma4_mm:Gemma4ForConditionalGeneration":
        CLASS,
    "vllm.model_executor.models.laguna:LagunaForCausalLM":
        CLASS,
    "vllm.v1.core.sched.scheduler:Scheduler.dynamic_sd_lookup":
        ATTRIBUTE,
    "vllm.v1.request:Request.spec_token_ids":
        ATTRIBUTE,
    "vllm.v1.core.sched.scheduler:Scheduler.need_mamba_block_aligned_split":
        ATTRIBUTE,
    "vllm.v1.core.sched.scheduler:Scheduler._preempt_request":
        '(self, request: Request, timestamp: float, drop_stale_output: bool=False) -> None',
    "vllm.v1.core.sched.scheduler:Scheduler.running":
        ATTRIBUTE,
    "vllm.v1.core.sched.scheduler:Scheduler.grammar_compile_error_reqs":
        ATTRIBUTE,
    "vllm.outputs:RequestError":
        CLASS,
    "vllm.v1.core.sched.scheduler:Scheduler.policy":
        ATTRIBUTE,
    "vllm.v1.request:Request.priority":
        ATTRIBUTE,
    "vllm.v1.request:Request.arrival_time":
        ATTRIBUTE,
    "vllm.v1.core.sched.output:SchedulerOutput.num_scheduled_tokens":
        ATTRIBUTE,
    "vllm.v1.request:Request.max_tokens":
        ATTRIBUTE,
    "vllm.v1.request:Request.num_output_placeholders":
        ATTRIBUTE,
    "vllm.v1.worker.utils:AttentionGroup.metadata_builders":
        ATTRIBUTE,
    "vllm.v1.attention.backend:AttentionMetadataBuilder.build":
        '(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool=False) -> M',
    "vllm.v1.attention.backend:AttentionMetadataBuilder.build_for_cudagraph_capture":
        '(self, common_attn_metadata: CommonAttentionMetadata) -> M',
    "vllm.v1.attention.backend:AttentionMetadataBuilder.build_for_drafting":
        '(self, common_attn_metadata: CommonAttentionMetadata, draft_index: int) -> M',
    "vllm.engine.arg_utils:EngineArgs.additional_config":
        ATTRIBUTE,
    "vllm.model_executor.layers.attention:Attention.get_kv_cache_spec":
        '(self, vllm_config: VllmConfig) -> KVCacheSpec | None',
    "vllm.v1.worker.block_table:BlockTable.compute_slot_mapping":
        '(self, num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor) -> None',
    "vllm.v1.attention.backend:AttentionImpl.forward":
        '(self, layer: AttentionLayer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, '
        'kv_cache: torch.Tensor, attn_metadata: T, output: torch.Tensor, output_scale: torch.Tensor | None=None, '
        'output_block_scale: torch.Tensor | None=None) -> torch.Tensor',
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states":
        "(self, scheduler_output: 'SchedulerOutput') -> Callable | None",
    "vllm.v1.core.sched.output:SchedulerOutput":
        CLASS,
    "vllm.v1.core.sched.scheduler:Scheduler.waiting":
        ATTRIBUTE,
    "vllm.v1.core.sched.scheduler:Scheduler.max_num_running_reqs":
        ATTRIBUTE,
    "vllm.v1.core.sched.scheduler:Scheduler.max_num_scheduled_tokens":
        ATTRIBUTE,
    "vllm.v1.core.sched.output:SchedulerOutput.total_num_scheduled_tokens":
        ATTRIBUTE,
    "vllm.v1.worker.block_table:BlockTable.num_blocks_per_row":
        ATTRIBUTE,
    "vllm.v1.worker.gpu_input_batch:CachedRequestState.block_ids":
        ATTRIBUTE,
    "vllm.v1.worker.gpu_input_batch:InputBatch.req_id_to_index":
        ATTRIBUTE,
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner.requests":
        ATTRIBUTE,
    "vllm.v1.worker.gpu.block_table:BlockTables.num_blocks":
        ATTRIBUTE,
    "vllm.v1.worker.gpu_worker:Worker.model_runner":
        ATTRIBUTE,
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.kv_cache_config":
        ATTRIBUTE,
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.device":
        ATTRIBUTE,
    "vllm.config.vllm:VllmConfig.use_v2_model_runner":
        '(self) -> bool',
    "vllm._custom_ops:cpu_attn_reshape_and_cache":
        "(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: "
        "torch.Tensor, isa: str, k_scale: float=1.0, v_scale: float=1.0, kv_cache_dtype: str='auto') -> None",
    "vllm._cpu_ops:cpu_attn_reshape_and_cache":
        "(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: "
        "torch.Tensor, isa: str, k_scale: float=1.0, v_scale: float=1.0, kv_cache_dtype: str='auto') -> None",
    "vllm.v1.attention.backends.cpu_attn:_get_attn_isa":
        '(dtype: torch.dtype, block_size: int, head_size: int | None=None, kv_cache_dtype: str | None=None) -> str',
    "vllm.v1.worker.gpu.block_table:BlockTables.append_block_ids":
        '(self, req_index: int, new_block_ids: tuple[list[int], ...], overwrite: bool) -> None',
    "vllm.v1.worker.gpu.block_table:BlockTables.compute_slot_mappings":
        '(self, idx_mapping: torch.Tensor, query_start_loc: torch.Tensor, positions: torch.Tensor, '
        'num_tokens_padded: int, out: torch.Tensor | None=None) -> torch.Tensor',
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.finish_requests":
        '(self, scheduler_output: SchedulerOutput) -> None',
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.prepare_attn":
        '(self, input_batch: InputBatch) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]',
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model":
        '(self, scheduler_output: SchedulerOutput, intermediate_tensors: IntermediateTensors | None=None, '
        'dummy_run: bool=False, skip_attn_for_dummy_run: bool=False, is_profile: bool=False, context_len: int=0, '
        'valid_dummy_state_slots: bool=False, '
        'randomize_inputs: bool=False) -> ModelRunnerOutput | IntermediateTensors | None',
    "vllm.v1.worker.gpu.spec_decode.dflash.speculator:DFlashSpeculator._generate_draft":
        '(self, num_reqs: int, num_tokens_padded: int, attn_metadata: dict[str, Any] | None, '
        'slot_mappings: dict[str, torch.Tensor] | None, num_tokens_across_dp: torch.Tensor | None, '
        'cudagraph_runtime_mode: CUDAGraphMode=CUDAGraphMode.NONE) -> None',
    "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager.run_fullgraph":
        '(self, desc: BatchExecutionDescriptor)',
    "vllm.v1.worker.gpu.spec_decode.dflash.speculator:DFlashSpeculator._prepare_graph_forward":
        '(self, num_reqs: int, attn_metadata: dict[str, Any] | None) -> None',
    "vllm.v1.worker.gpu.model_states.mamba_hybrid:MambaHybridModelState.preprocess_state":
        '(self, input_batch: InputBatch, block_tables: tuple[torch.Tensor, ...], kv_cache_config: KVCacheConfig, '
        'num_computed_tokens: torch.Tensor) -> None',
    "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.combine_hidden_states":
        '(self, hidden_states: torch.Tensor) -> torch.Tensor',
    "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.precompute_and_store_context_kv":
        '(self, context_states: torch.Tensor, context_positions: torch.Tensor, '
        'context_slot_mapping: torch.Tensor | list[torch.Tensor | None] | None=None) -> None',
    "vllm.v1.core.sched.async_scheduler:AsyncScheduler._mamba_block_aligned_split":
        '(self, request: Request, num_new_tokens: int, num_new_local_computed_tokens: int=0, '
        'num_external_computed_tokens: int=0) -> int',
    "vllm.v1.kv_cache_interface:FullAttentionSpec.max_num_blocks_per_req":
        '(self, vllm_config: VllmConfig, max_len: int) -> int',
    "vllm.v1.kv_cache_interface:FullAttentionSpec.max_memory_usage_bytes":
        '(self, vllm_config: VllmConfig) -> int',
    "vllm.v1.kv_cache_interface:FullAttentionSpec.prefix_cacheable":
        '(self) -> bool',
    "vllm.v1.kv_cache_interface:FullAttentionSpec.merge":
        '(cls, specs: list[Self]) -> Self',
    "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager.supports_fine_grained_hash_lookup":
        ATTRIBUTE,
    "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager.__init__":
        '(self, kv_cache_spec: KVCacheSpec, block_pool: BlockPool, enable_caching: bool, kv_cache_group_id: int, '
        'scheduler_block_size: int, dcp_world_size: int=1, pcp_world_size: int=1, '
        'needs_kv_cache_zeroing: bool=False, max_admission_blocks_per_request: int | None=None) -> None',
    "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager.get_num_blocks_to_allocate":
        '(self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock], '
        'total_computed_tokens: int, num_local_computed_tokens: int, num_tokens_main_model: int, '
        'apply_admission_cap: bool=False, prefill_end: int=0) -> int',
    "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager.allocate_new_blocks":
        '(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[KVCacheBlock]',
    "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager.free":
        '(self, request_id: str) -> None',
    "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager.allocate_external_computed_blocks":
        '(self, request_id: str, num_local_computed_tokens: int, num_external_computed_tokens: int, '
        'record_for_zeroing: bool=True) -> None',
    "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager.find_longest_cache_hit":
        '(cls, block_hashes: BlockHashList, max_length: int, kv_cache_group_ids: list[int], block_pool: BlockPool, '
        'kv_cache_spec: KVCacheSpec, drop_eagle_block: bool, alignment_tokens: int, dcp_world_size: int=1, '
        'pcp_world_size: int=1) -> tuple[tuple[list[KVCacheBlock], ...], int]',
    "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager.cache_blocks":
        '(self, request: Request, num_tokens: int, retention_interval: int | None=None, *, '
        'replay_boundaries: Sequence[int]) -> None',
    "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager.remove_skipped_blocks":
        '(self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None=None) -> None',
    "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager.get_num_skipped_tokens":
        '(self, num_computed_tokens: int) -> int',
    "vllm.v1.core.sched.scheduler:Scheduler.__init__":
        '(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, '
        'structured_output_manager: StructuredOutputManager, block_size: int, hash_block_size: int | None=None, '
        'mm_registry: MultiModalRegistry=MULTIMODAL_REGISTRY, include_finished_set: bool=False, '
        'log_stats: bool=False) -> None',
    "vllm.v1.core.sched.async_scheduler:AsyncScheduler.__init__":
        '(self, *args, **kwargs) -> None',
    "vllm.v1.core.sched.scheduler:Scheduler.add_request":
        '(self, request: Request) -> None',
    "vllm.v1.core.sched.async_scheduler:AsyncScheduler.add_request":
        '(self, request: Request) -> None',
    "vllm.v1.core.sched.scheduler:Scheduler.schedule":
        '(self, throttle_prefills: bool=False) -> SchedulerOutput',
    "vllm.v1.core.sched.async_scheduler:AsyncScheduler.schedule":
        '(self, throttle_prefills: bool=False) -> SchedulerOutput',
    "vllm.v1.core.sched.scheduler:Scheduler.update_from_output":
        '(self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput) -> dict[int, '
        'EngineCoreOutputs]',
    "vllm.v1.core.sched.async_scheduler:AsyncScheduler.update_from_output":
        '(self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput) -> dict[int, '
        'EngineCoreOutputs]',
    "vllm.v1.core.sched.scheduler:Scheduler.shutdown":
        '(self) -> None',
    "vllm.v1.core.sched.async_scheduler:AsyncScheduler.shutdown":
        '(self) -> None',
    "vllm.model_executor.models.qwen3_5:Qwen3_5ForCausalLM.__init__":
        "(self, *, vllm_config: VllmConfig, prefix: str='')",
    "vllm.model_executor.models.qwen3_5:Qwen3_5MoeForCausalLM.__init__":
        "(self, *, vllm_config: VllmConfig, prefix: str='')",
    "vllm.model_executor.models.qwen3_5:Qwen3_5ForConditionalGeneration.__init__":
        "(self, *, vllm_config: VllmConfig, prefix: str='model')",
    "vllm.model_executor.models.qwen3_5:Qwen3_5MoeForConditionalGeneration.__init__":
        "(self, *, vllm_config: VllmConfig, prefix: str='model')",
    "vllm.model_executor.models.gemma4:Gemma4ForCausalLM.__init__":
        "(self, *, vllm_config: VllmConfig, prefix: str='')",
    "vllm.model_executor.models.gemma4_mm:Gemma4ForConditionalGeneration.__init__":
        "(self, *, vllm_config: VllmConfig, prefix: str='')",
    "vllm.model_executor.models.laguna:LagunaForCausalLM.__init__":
        "(self, *, vllm_config: VllmConfig, prefix: str='')",
    "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.__init__":
        "(self, *, vllm_config: VllmConfig, prefix: str='')",
    "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.compute_logits":
        '(self, hidden_states: torch.Tensor) -> torch.Tensor | None',
}
# name -> {series: what it is there; None where that release lacks it}, where a series differs from 0.32
PER_SERIES: dict[str, dict[str, str | None]] = {
    **PER_SERIES_READS,
    # The message of an error finish reaches the client from 0.33 (0.32 has the class, unused there by the scheduler).
    "vllm.outputs:RequestError": {"0.26": None},
    # Called with (request, timestamp) only: the same in every series.
    "vllm.v1.core.sched.scheduler:Scheduler._preempt_request": {
        "0.26": '(self, request: Request, timestamp: float) -> None',
    },
    # The wrapper passes every argument through.
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model": {
        "0.26": (
            '(self, scheduler_output: SchedulerOutput, intermediate_tensors: IntermediateTensors | None=None, '
            'dummy_run: bool=False, skip_attn_for_dummy_run: bool=False, '
            'is_profile: bool=False) -> ModelRunnerOutput | IntermediateTensors | None'
        ),
    },
    # plain_steps_v2.py looks it up with getattr: 0.26's drafter graph has no separate context write.
    "vllm.v1.worker.gpu.spec_decode.dflash.speculator:DFlashSpeculator._prepare_graph_forward": {
        "0.26": None,
    },
    # 0.26 never asks; KVFlash switches prefix caching off there (the enable_prefix_caching row).
    "vllm.v1.kv_cache_interface:FullAttentionSpec.prefix_cacheable": {
        "0.26": None,
    },
    # KVFlashManager passes vLLM's trailing parameters through, so its overrides serve both forms.
    "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager.get_num_blocks_to_allocate": {
        "0.26": (
            '(self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock], '
            'total_computed_tokens: int, num_local_computed_tokens: int, num_tokens_main_model: int, '
            'apply_admission_cap: bool=False) -> int'
        ),
    },
    "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager.allocate_external_computed_blocks": {
        "0.26": '(self, request_id: str, num_local_computed_tokens: int, num_external_computed_tokens: int) -> None',
    },
    "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager.cache_blocks": {
        "0.26": '(self, request: Request, num_tokens: int, retention_interval: int | None=None) -> None',
    },
    # vLLM's --middleware (FrontendArgs) moves module from series to series; each checks the one it has.
    "vllm.entrypoints.openai.cli_args:FrontendArgs.middleware": {
        "0.32": None, "0.33": None, "0.34": None,
    },
    "vllm.entrypoints.launchers.cli_args:FrontendArgs.middleware": {
        "0.26": None, "0.33": None, "0.34": None,
    },
    # vLLM 0.34 has Model Runner V2 alone and no property to ask (plain_steps_v2.v2_on_cuda takes V2 then).
    "vllm.config.vllm:VllmConfig.use_v2_model_runner": {"0.34": None},
    # vLLM 0.34 moved its CPU ops to vllm._cpu_ops (kvflash/cache_layout.py takes the module the release has).
    "vllm._custom_ops:cpu_attn_reshape_and_cache": {"0.34": None},
    "vllm._cpu_ops:cpu_attn_reshape_and_cache": {"0.26": None, "0.32": None, "0.33": None},
    # vLLM 0.34 deleted Model Runner V1 (its block table, input batch and request states) and V1's drafting builds:
    # the rows that bind V1 never run there (their initialize_kv_cache patch is left alone).
    **dict.fromkeys(("vllm.v1.worker.block_table:BlockTable.compute_slot_mapping",
                     "vllm.v1.worker.block_table:BlockTable.num_blocks_per_row",
                     "vllm.v1.worker.gpu_input_batch:CachedRequestState.block_ids",
                     "vllm.v1.worker.gpu_input_batch:InputBatch.req_id_to_index",
                     "vllm.v1.worker.gpu_model_runner:GPUModelRunner.requests",
                     "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states",
                     # PooledBuilder's build_for_drafting has no caller there
                     "vllm.v1.attention.backend:AttentionMetadataBuilder.build_for_drafting"), {"0.34": None}),
    "vllm.entrypoints.common.cli_args:FrontendArgs.middleware": {
        "0.26": None, "0.32": None,
    },
}


def expected_in(name: str, series: str) -> str | None:
    """What ``name`` is in a vLLM series (None: the release lacks it)."""
    return PER_SERIES.get(name, {}).get(series, EXPECTED[name])
