"""Observe a DFlash engine from a test: the in-process engine core and the drafts it schedules."""

from fixtures import trained_llm as F


def engine(llm):
    return llm.llm_engine.engine_core.engine_core


def drafts_by_prompt(llm, prompts, gen):
    """{prompt index: {request length: drafts}} from what the scheduler receives."""
    sched, seen = engine(llm).scheduler, {}
    update = sched.update_draft_token_ids
    index = {tuple(p[:16]): i for i, p in enumerate(prompts)}

    def record(draft_token_ids):
        for req_id, drafts in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids):
            request = sched.requests.get(req_id)
            if request is not None and drafts:
                key = index[tuple(request.prompt_token_ids[:16])]
                seen.setdefault(key, {})[request.num_tokens] = list(drafts)
        return update(draft_token_ids)

    sched.update_draft_token_ids = record
    try:
        outs = F.greedy(llm, prompts, gen)
    finally:
        del sched.update_draft_token_ids
    return seen, outs


# Output equality across engines. A speculating engine runs the target through other kernels (on
# hybrid targets, vLLM's speculative Gated DeltaNet path) and other shapes than a plain one, so bf16
# logits drift apart by a few hundredths of a nat over a generation. Where the plain run's top two
# candidates are within NEAR_TIE nats, either choice is the target's greedy answer, and the texts may
# part there (the usual bar for speculative decoding). A divergence anywhere else fails.
NEAR_TIE = 0.25


def greedy_with_margins(llm, prompts, max_tokens: int):
    """Greedy token ids per prompt and, per position, the top-1 minus top-2 log-probability."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=2)
    inputs = [p if isinstance(p, (str, dict)) else {"prompt_token_ids": p} for p in prompts]
    outs = llm.generate(inputs, params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    margins = []
    for o in outs:
        row = []
        for step in o.outputs[0].logprobs:
            vals = sorted((lp.logprob for lp in step.values()), reverse=True)
            row.append(vals[0] - vals[1] if len(vals) > 1 else float("inf"))
        margins.append(row)
    return tokens, margins


def assert_same_until_near_tie(expected, margins, got) -> int:
    """``got`` equals ``expected`` up to the first near-tie of the plain run; returns how many
    sequences matched in full."""
    full = 0
    for n, (e, m, g) in enumerate(zip(expected, margins, got, strict=True)):
        diverged = next((i for i, (a, b) in enumerate(zip(e, g)) if a != b), None)
        if diverged is None:
            assert len(e) == len(g), (n, len(e), len(g))
            full += 1
            continue
        assert m[diverged] < NEAR_TIE, (f"sequence {n} diverges at token {diverged}, where the plain "
                                         f"run's top-2 margin is {m[diverged]:.3f} nats (not a near-tie)")
    return full
