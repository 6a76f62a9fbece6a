"""Observe a DFlash engine from a test: the in-process engine core and the drafts it schedules."""

from benchmarks import fidelity as F


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
