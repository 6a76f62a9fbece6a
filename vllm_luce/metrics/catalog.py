"""Every vllm-luce metric: its name under ``vllm:luce_``, kind and help (the single source for
``/metrics``, ``docs/metrics.md`` and its test). Counters are exposed with Prometheus' ``_total``."""

from __future__ import annotations

PREFIX = "vllm:luce_"

# name -> (kind, labels besides model_name, help)
CATALOG: dict[str, tuple[str, tuple[str, ...], str]] = {
    # DFlash: the gate in the engine core's scheduler
    "dflash_gate_steps": ("counter", ("mode",), "Steps the DFlash gate ran speculative (mode=spec) or plain (mode=plain)."),
    "dflash_gate_explorations": ("counter", (), "Gate steps that re-measured the mode currently losing."),
    "dflash_gate_speculating": ("gauge", (), "1 if the gate's latest decision was to speculate, else 0."),
    "dflash_gate_rate_tokens_per_second": (
        "gauge", ("mode", "batch_le"),
        "The gate's smoothed committed tokens per second per regime (batch size bucketed to powers of two) and mode, "
        "over steps without prompt tokens."),
    "dflash_gate_speedup": (
        "gauge", ("batch_le",),
        "The gate's verdict per regime: speculative over plain committed-token rate (speculation runs where it is "
        "at least 1)."),
    "dflash_requests_not_drafting": ("gauge", (), "Running requests whose drafting the gate stopped for low acceptance."),
    "dflash_drafts": ("counter", (), "Request verify steps (a request's drafts checked by the target once)."),
    "dflash_verified_tokens": ("counter", (), "Draft tokens sent to verification (mean verify width = this / drafts)."),
    "dflash_accepted_tokens": ("counter", (), "Draft tokens accepted by the target."),
    "dflash_accepted_tokens_per_pos": (
        "counter", ("position",), "Draft tokens accepted at each draft position (acceptance rate = this / drafts)."),
    # KVFlash: the pagers in each worker (rank label: every rank decides the same; bytes are per rank)
    "kvflash_requests": ("gauge", ("rank",), "Requests with a KVFlash pager."),
    "kvflash_resident_chunks": ("gauge", ("rank",), "Chunks of KV resident in the GPU pools of those requests."),
    "kvflash_host_chunks": ("gauge", ("rank",), "Chunks of KV paged out to host memory."),
    "kvflash_host_bytes": ("gauge", ("rank",), "Host memory held by paged-out KV, in bytes."),
    "kvflash_page_outs": ("counter", ("rank",), "Chunks paged out to host memory."),
    "kvflash_page_ins": ("counter", ("rank",), "Chunks paged back into the pool."),
    "kvflash_page_out_bytes": ("counter", ("rank",), "Bytes copied to host memory."),
    "kvflash_page_in_bytes": ("counter", ("rank",), "Bytes copied back from host memory."),
    "kvflash_reselections": ("counter", ("rank",), "Relevance reselections run (with paged-out chunks to choose from)."),
    "kvflash_reselection_seconds": ("counter", ("rank",), "Time spent in reselections (scoring and page-ins)."),
    "kvflash_host_budget_drops": (
        "counter", ("rank",), "Chunks dropped instead of paged out because kvflash.host_bytes was spent."),
    "kvflash_sfi_sparse_steps": ("counter", ("rank",), "SFI decode steps of a request over its selection only."),
    "kvflash_sfi_dense_steps": ("counter", ("rank",), "SFI dense refresh steps of a request over its whole context."),
    # PFlash: the engine client (API server)
    "pflash_prompts": ("counter", ("outcome",),
                       "Prompts seen by PFlash: compressed, kept (scoring kept everything), failed, or a skip reason."),
    "pflash_prompt_tokens": ("counter", (), "Prompt tokens of compressed prompts, as sent."),
    "pflash_kept_tokens": ("counter", (), "Tokens prefilled for those prompts (compression ratio = kept / prompt)."),
    "pflash_compression_ratio": ("gauge", (), "Kept / prompt tokens of the latest compressed prompt."),
    "pflash_scoring_seconds": ("counter", (), "Drafter scoring and selection time of scored prompts."),
}
