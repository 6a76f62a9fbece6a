"""Every vllm-luce metric: its name under ``vllm:luce_``, kind and help (the single source for
``/metrics``, ``docs/metrics.md`` and its test). Counters are exposed with Prometheus' ``_total``."""

from __future__ import annotations

PREFIX = "vllm:luce_"

# Every value of pflash_prompts' outcome label: a fixed set, so that no client-supplied value becomes a series.
PFLASH_OUTCOMES = (
    "compressed", "kept", "failed", "queue_full", "deadline", "cancelled",
    "skipped_not_a_generation_request", "skipped_not_a_token_prompt", "skipped_tools", "skipped_tool_choice",
    "skipped_response_format", "skipped_opted_out", "skipped_prompt_logprobs", "skipped_short_prompt", "skipped_other",
)

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
    "kvflash_cold_chunks": ("gauge", ("rank",), "Chunks of KV paged out to free KV cache blocks on the GPU."),
    "kvflash_host_bytes": ("gauge", ("rank",), "Host memory held by paged-out KV, in bytes."),
    "kvflash_pinned_bytes": ("gauge", ("rank",), "Host memory pinned at startup for page-outs, in bytes."),
    "kvflash_page_outs": ("counter", ("rank",), "Chunks paged out of the pool, to free KV blocks or host memory."),
    "kvflash_cold_page_outs": ("counter", ("rank",), "Of the page-outs, those to free KV cache blocks on the GPU."),
    "kvflash_pageable_page_outs": (
        "counter", ("rank",), "Page-outs copied to pageable host memory (every pinned chunk was in use): slower."),
    "kvflash_page_ins": ("counter", ("rank",), "Chunks paged back into the pool."),
    "kvflash_cold_demotions": (
        "counter", ("rank",), "Cold chunks moved to host memory because their KV blocks went back to vLLM."),
    "kvflash_page_out_bytes": ("counter", ("rank",), "Bytes copied to host memory."),
    "kvflash_page_in_bytes": ("counter", ("rank",), "Bytes copied back from host memory."),
    "kvflash_reselections": ("counter", ("rank",), "Relevance reselections run (with paged-out chunks to choose from)."),
    "kvflash_reselection_seconds": ("counter", ("rank",), "Time spent in reselections (scoring and page-ins)."),
    "kvflash_host_budget_drops": (
        "counter", ("rank",), "Chunks dropped because kvflash.host_bytes was spent (only with host_full 'drop')."),
    "kvflash_lost_chunks": (
        "counter", ("rank",), "Chunks of a context found in no tier (a bug: the request's answer is wrong; logged)."),
    "kvflash_page_mismatches": (
        "counter", ("rank",), "Chunks paged back in whose bytes differ from those paged out (kvflash.verify_pages "
        "only; a bug: the request's answer is wrong; logged)."),
    "kvflash_uncut_decisions": (
        "counter", ("rank",), "KVFlash decision positions a step ran across, decided at its start: those requests' "
        "tokens may depend on other requests (0 where vllm-luce's scheduler cuts the steps)."),
    "kvflash_host_over_reserved_chunks": (
        "counter", ("rank",), "Host chunks held beyond the scheduler's reservation, summed over steps (a bug; logged)."),
    "kvflash_sfi_sparse_steps": ("counter", ("rank",), "SFI decode steps of a request over its selection only."),
    "kvflash_sfi_dense_steps": ("counter", ("rank",), "SFI dense refresh steps of a request over its whole context."),
    # KVFlash: the tiers in the engine core's scheduler (engine label: the data-parallel rank)
    "kvflash_host_budget_bytes": ("gauge", ("engine",), "The host's budget for paged-out KV (kvflash.host_bytes)."),
    "kvflash_host_reserved_bytes": (
        "gauge", ("engine",), "Host memory this engine's running requests have reserved for paged-out KV."),
    "kvflash_held_back_requests": (
        "gauge", ("engine",), "Requests held back at the latest step because their page-outs would not fit host memory."),
    "kvflash_held_back_steps": ("counter", ("engine",), "Request steps held back for host memory, summed."),
    "kvflash_lent_blocks_returned": (
        "counter", ("engine",), "KV blocks lent for cold chunks taken back for waiting requests."),
    "kvflash_host_wait_errors": (
        "counter", ("engine",), "Requests ended with an error because host memory was not granted within "
        "kvflash.host_wait_s, or they asked for more than kvflash.host_request_bytes."),
    # PFlash: the engine client (API server), and the scoring queue on rank 0's worker
    "pflash_prompts": ("counter", ("outcome",),
                       "Prompts seen by PFlash, by outcome: compressed; kept (scoring kept everything); failed; "
                       "queue_full, deadline (prefilled uncompressed: the scoring queue was full, or the pass had not "
                       "ended by pflash.queue_timeout_s); cancelled (the client went away while its prompt was queued "
                       "or scored); or skipped_<reason>, where reason is one of "
                       + ", ".join(o.removeprefix("skipped_") for o in PFLASH_OUTCOMES if o.startswith("skipped_"))
                       + "."),
    "pflash_prompt_tokens": ("counter", (), "Prompt tokens of compressed prompts, as sent."),
    "pflash_kept_tokens": ("counter", (), "Tokens prefilled for those prompts (compression ratio = kept / prompt)."),
    "pflash_compression_ratio": ("gauge", (), "Kept / prompt tokens of the latest compressed prompt."),
    "pflash_scoring_seconds": ("counter", (), "Drafter scoring and selection time of scored prompts."),
    "pflash_queue_depth": ("gauge", (),
                           "Prompts the scoring queue holds: waiting, being scored, or scored and not yet collected by "
                           "the API server (at most a poll, 5-50 ms)."),
    "pflash_queued_prompts": ("counter", (), "Prompts the scoring queue took."),
    "pflash_waiting_requests": ("gauge", (),
                                "Requests the API server holds until their scoring pass answers: queued on rank 0 or "
                                "being scored (the API server's own count, current at every scrape)."),
    "pflash_queue_wait_seconds": ("counter", (),
                                  "Time prompts waited in the scoring queue before their pass started, or until they "
                                  "left it unscored (mean wait = this / queued_prompts)."),
}
