"""KVFlash's "evicted earlier, asked again" case (issue 41) through real vLLM: one request per case whose
continuation is scripted (``tests/fixtures/forced.py``) as a conversation. The prompt holds needle A and
``OTHERS`` other needles and asks for A: the pool brings A's chunk in at the prompt's end. Then it asks for each
other needle in turn and reads ``FILLER_TOKENS`` or more of other code, which moves the pool on. Then it asks
for A again: where A's chunk was evicted meanwhile, the pool must page it back in at the reselection that reads
the question. Each later question's last token is placed on a step that reselects (``reselection_outputs``:
the pager's own schedule, checked against what the pagers did).

Per config: the accuracy of the first ask, of the other asks and of the re-ask, and from the pagers (recorded
in-process by ``record_reselections``):
* ``selected``: A's digits were resident after the prompt-end reselection;
* ``evicted``: at the re-ask's reselection, neither A's needle nor the first answer's digits were resident
  before it (they had been paged out since);
* ``again_when_evicted``: re-asks answered among those cases (the pool had to bring the chunk back);
* ``aligned``: cases whose pager reselected at every question's step (must be all of them).
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager

from tests.fixtures import needle as N
from tests.fixtures.trained import heldout_files
from vllm_luce.kvflash.pager import PagerConfig, RequestPager, TensorStore
from vllm_luce.kvflash.policies import LRU

FILLER_TOKENS = 384  # 6 chunks: the first answer leaves the 4 recent chunks, and reselections run in between
OTHERS = 3  # other needles asked for in between


def reselection_outputs(config: PagerConfig, prompt_tokens: int, outputs: int) -> list[int]:
    """Output indices ``i`` whose decode step (the one that reads output ``i``) reselects, for a prompt of
    ``prompt_tokens``: the real pager run on an empty store, prefilled through the pool, its last prompt token
    alone (as vLLM schedules it, ``prompt_end.py``), then one token a step."""
    pager = RequestPager(config, TensorStore(config.pool_chunks, (config.chunk_tokens, 1, 1)))
    policy, start = LRU(), 0
    while start < prompt_tokens - 1:
        n = min(config.max_step_tokens, prompt_tokens - 1 - start)
        pager.prepare(start, n, policy)
        start += n
    pager.prepare(prompt_tokens - 1, 1, policy, prompt_end=True)
    found = []
    for i in range(outputs):
        before = pager.stats.reselections
        pager.prepare(prompt_tokens + i, 1, policy, decoded=1)
        if pager.stats.reselections > before:
            found.append(i)
    return found


def make_cases(tokenizer, tokens: int, seeds: range, pool_tokens: int, depths=(0.1, 0.3, 0.5, 0.7, 0.9),
               filler_tokens: int = FILLER_TOKENS, others: int = OTHERS) -> list[N.ReaskCase]:
    """The same scripts for every config (full KV included): the schedule of a pool of ``pool_tokens``."""
    config = PagerConfig(pool_tokens=pool_tokens)
    return [N.make_reask_case(tokenizer, list(heldout_files()), tokens=tokens, depth=d, seed=s, others=others,
                              reselections=lambda p, n: reselection_outputs(config, p, n), filler_tokens=filler_tokens)
            for s in seeds for d in depths]


@contextmanager
def record_reselections():
    """``RequestPager._reselect`` records, per request id, (tokens, resident before, resident after) of every
    reselection while the block runs (in-process engines: VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    events: dict[str, list] = defaultdict(list)
    original = RequestPager._reselect

    def recording(self, policy):
        before = list(self.resident)
        loads = original(self, policy)
        events[self.req_id].append((self.num_tokens, set(before), set(self.resident)))
        return loads

    RequestPager._reselect = recording
    try:
        yield events
    finally:
        RequestPager._reselect = original


def reask_accuracy(llm, cases: list[N.ReaskCase], chunk_tokens: int = 64) -> dict:
    """Generate every case's scripted conversation in one batch; score the asks and what the pagers did."""
    from vllm import SamplingParams

    from tests.fixtures.forced import SCRIPT_KEY

    tokenizer = llm.get_tokenizer()
    params = [SamplingParams(max_tokens=len(c.script), temperature=0.0, ignore_eos=True,
                             extra_args={SCRIPT_KEY: c.script}) for c in cases]
    with record_reselections() as events:
        outs = llm.generate([{"prompt_token_ids": c.prompt_ids} for c in cases], params, use_tqdm=False)
    mine = [events_of(events, out.request_id) for out in outs] if events else None
    return score_conversations(tokenizer, cases, [list(o.outputs[0].token_ids) for o in outs], mine, chunk_tokens)


def events_of(events: dict, request_id: str) -> list:
    """The recorded reselections of the request vLLM returned as ``request_id`` (its engine id adds a suffix)."""
    return events.get(next((k for k in events if k.rsplit("-", 1)[0] == request_id), None), [])


def score_conversations(tokenizer, cases: list[N.ReaskCase], outputs: list[list[int]], events: list | None,
                        chunk_tokens: int = 64) -> dict:
    """Each ask's accuracy over the conversations' output ids; with each conversation's recorded reselections
    ``(tokens, resident before, resident after)`` (pooled engines), what the pagers did (module docstring)."""
    hits = {name: 0 for name in cases[0].asks}
    selected = evicted = again_when_evicted = aligned = 0
    for i, (case, ids) in enumerate(zip(cases, outputs)):
        ok = {name: N.answered(tokenizer, ids, at, case.answers[name]) for name, at in case.asks.items()}
        for name, hit in ok.items():
            hits[name] += hit
        if events is None:
            continue
        by_tokens = {tokens: (set(before), set(after)) for tokens, before, after in events[i]}
        p = len(case.prompt_ids)
        needle = set(range(case.needle_tokens[0] // chunk_tokens, (case.needle_tokens[1] - 1) // chunk_tokens + 1))
        answer = set(range(p // chunk_tokens, (p + N.NEEDLE_DIGITS - 1) // chunk_tokens + 1))
        steps = {name: p + at + 1 for name, at in case.reselect_at.items()}  # tokens once the question is read
        aligned += all(t in by_tokens for t in steps.values()) and p in by_tokens
        selected += bool(needle & by_tokens.get(p, (set(), set()))[1])
        before, _ = by_tokens.get(steps["again"], (needle | answer, set()))
        if not (needle | answer) & before:
            evicted += 1
            again_when_evicted += ok["again"]
    n = len(cases)
    others = [h for name, h in hits.items() if name.startswith("other")]
    result = {"cases": n, "first_accuracy": round(hits["first"] / n, 3),
              "others_accuracy": round(sum(others) / max(1, n * len(others)), 3),
              "again_accuracy": round(hits["again"] / n, 3),
              "script_tokens": round(sum(len(c.script) for c in cases) / n),
              "mean_prompt_tokens": round(sum(len(c.prompt_ids) for c in cases) / n)}
    if events is not None:
        result.update(selected=selected, evicted=evicted, again_when_evicted=again_when_evicted, aligned=aligned)
    return result


def needle_selection(llm, tokens: int, seeds: range, distractors: int = 0, chunk_tokens: int = 64) -> dict:
    """The needle harness of ``fidelity.needle_accuracy`` with the pagers' reselections recorded: in how many
    prompts the needle's digits were resident after the prompt-end reselection (``selected``), and how many of
    those, and of the others, were answered."""
    from vllm import SamplingParams

    from benchmarks.fidelity import DEPTHS

    tokenizer = llm.get_tokenizer()
    cases = N.make_cases(tokenizer, list(heldout_files()), tokens=tokens, depths=DEPTHS, seeds=seeds,
                         distractors=distractors)
    prompts, needles = [], []
    for case in cases:
        enc = tokenizer(case.prompt, add_special_tokens=False, return_offsets_mapping=True)
        asked = case.prompt.rsplit("\n", 1)[1]
        at = case.prompt.index(asked + case.answer) + len(asked)
        needles.append({i // chunk_tokens for i, (a, b) in enumerate(enc["offset_mapping"])
                        if a < at + N.NEEDLE_DIGITS and b > at})
        prompts.append({"prompt_token_ids": enc["input_ids"]})
    with record_reselections() as events:
        outs = llm.generate(prompts, SamplingParams(max_tokens=N.NEEDLE_DIGITS + 2, temperature=0.0), use_tqdm=False)
    found = {"cases": len(cases), "selected": 0, "answered": 0, "answered_when_selected": 0}
    for case, out, need, prompt in zip(cases, outs, needles, prompts):
        hit = N.retrieved(case, out.outputs[0].text)
        mine = events_of(events, out.request_id) if events else []
        after = next((a for t, _, a in mine if t == len(prompt["prompt_token_ids"])), set())
        selected = need <= after
        found["selected"] += selected
        found["answered"] += hit
        found["answered_when_selected"] += hit and selected
    return found
