"""KV blocks lent for cold chunks come back when vLLM needs them for new requests (issue 68, item 5), through real
vLLM (CPU, V1 runner): a long request's cold chunks fill free KV blocks; short requests arrive and find too few free
blocks; the scheduler takes lent blocks back (the newest holder first, its host memory reserved), the worker moves
those chunks to host memory before the blocks change hands (bit for bit), and the short requests start sooner than
without it. No block is in two requests' rows at any step (KVFlash's audit), nothing is lost or beyond its
reservation, nobody is preempted, and every greedy answer is the one a cache large enough to need nothing back gives,
up to a near-tie."""

import pytest
import torch

from tests.e2e.dflash_probe import engine
from tests.e2e.test_kvflash import kvflash, prompt, runtime
from tests.e2e.test_kvflash_refusal import record_preemptions
from tests.e2e.test_kvflash_tiers import first_differences_beyond_a_near_tie, hashed_scores
from vllm_luce.kvflash.pager import RequestPager
from vllm_luce.kvflash.policies import Scorer

pytestmark = pytest.mark.e2e

SHORT = 8
TIGHT = 30  # KV blocks of 640 tokens: the long request's pool and lent blocks, 5 short requests, vLLM's reserve
ROOMY = 400  # nothing has to come back


@pytest.fixture(scope="module")
def qwen(tiny_model):
    return tiny_model("qwen3_6")


def check_moved_bytes(monkeypatch) -> list[int]:
    """Each give-back's cold chunks beyond the cut read before, and where they went after (a cold position below or
    host memory): the bytes equal. Returns the chunks checked, appended as they are."""
    checked, give_back = [], RequestPager.give_back

    def checking(pager, capacity):
        before = {c: pager.store.read(p).clone() for c, p in pager.cold.items() if p >= capacity}
        moved = give_back(pager, capacity)
        for chunk, data in before.items():
            after = pager.host[chunk] if chunk in pager.host else pager.store.read(pager.cold[chunk])
            assert torch.equal(after, data), f"request {pager.req_id}: chunk {chunk} changed as its block went back"
            checked.append(chunk)
        return moved

    monkeypatch.setattr(RequestPager, "give_back", checking)
    return checked


def run(path, blocks: int, **llm_args) -> dict:
    """The long request until it holds lent blocks, then the short ones: each request's greedy tokens and top-2 gaps,
    the steps the short requests waited to be first scheduled (summed), and the engine's counts."""
    from vllm import LLM, SamplingParams

    from vllm_luce.kvflash.spec import KVFlashManager

    llm = LLM(str(path), max_model_len=4096, enforce_eager=True, dtype="bfloat16", num_gpu_blocks_override=blocks,
              additional_config=kvflash(1024, audit=True), **llm_args)
    runtime(llm).policy = Scorer(hashed_scores)  # the same chunks kept in every engine: the same bytes, same tokens
    scheduler = engine(llm).scheduler
    manager = next(m for m in scheduler.kv_cache_manager.coordinator.single_type_managers
                   if isinstance(m, KVFlashManager))
    preempted, started, schedule = record_preemptions(scheduler), {}, scheduler.schedule

    def recording(*args, **kwargs):
        out = schedule(*args, **kwargs)
        for req_id in out.num_scheduled_tokens:
            started.setdefault(req_id.split("-")[0], len(steps))
        return out

    scheduler.schedule = recording
    steps, outputs, free_before = [], {}, manager.block_pool.get_num_free_blocks()
    sampling = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True, logprobs=2)
    # long enough to reselect twice after the blocks come back: chunks moved to host memory come back into the pool
    llm.llm_engine.add_request("long", prompt(3800, 1), SamplingParams(max_tokens=240, temperature=0, ignore_eos=True,
                                                                       logprobs=2))
    while len(steps) < 10:  # prefill: its cold chunks go to lent blocks
        steps.append(llm.llm_engine.step())
    lent = manager.luce_lent_blocks(scheduler.running[0].request_id) if scheduler.running else 0
    for i in range(SHORT):
        llm.llm_engine.add_request(f"short{i}", prompt(300, 10 + i), sampling)
    while len(outputs) < SHORT + 1:
        assert len(steps) < 400, sorted(outputs)
        step = llm.llm_engine.step()
        steps.append(step)
        outputs.update({o.request_id: o.outputs[0] for o in step if o.finished})
    names = ["long", *(f"short{i}" for i in range(SHORT))]
    gaps = [[max(0.0, top[0] - top[1]) for top in ([sorted((lp.logprob for lp in s.values()), reverse=True)
                                                   for s in outputs[n].logprobs])] for n in names]
    result = {"tokens": [list(outputs[n].token_ids) for n in names], "gaps": gaps, "lent": lent,
              "waited": sum(started[f"short{i}"] for i in range(SHORT)) - SHORT * 10, "preempted": preempted,
              "returned": scheduler.luce_admission.returned_blocks, "stats": runtime(llm).stats(),
              "free_after": manager.block_pool.get_num_free_blocks() == free_before,
              "reserved_after": scheduler.luce_admission.total()}
    del llm
    return result


def test_lent_blocks_come_back_for_new_requests_and_no_answer_changes(qwen, monkeypatch):
    checked = check_moved_bytes(monkeypatch)
    roomy, tight = run(qwen, ROOMY), run(qwen, TIGHT)
    from vllm_luce.kvflash.scheduler import KVFlashSchedulerMixin

    monkeypatch.setattr(KVFlashSchedulerMixin, "_luce_take_back", lambda self: {})
    kept = run(qwen, TIGHT)  # the blocks stay lent until the long request ends
    assert tight["lent"] > 0 and kept["lent"] > 0  # the long request held lent blocks when the others came
    assert tight["returned"] > 0 and tight["stats"]["demotions"] > 0 and kept["returned"] == 0
    assert len(checked) >= tight["stats"]["demotions"] and tight["stats"]["bytes_in"] > 0  # moved bit-exact, read back
    assert tight["waited"] < kept["waited"], (tight["waited"], kept["waited"])  # the short ones start sooner
    for result in (tight, kept):
        assert result["preempted"] == [] and result["stats"]["lost"] == 0, result
        assert result["stats"]["host_over_reserved"] == 0  # the scheduler reserved every chunk moved to host memory
        assert result["free_after"] and result["reserved_after"] == 0
        # no block in two requests' rows, no token written outside its request's blocks, at any step
        assert result["stats"]["audit_steps"] > 0, result["stats"]
        assert result["stats"]["audit_shared_blocks"] == result["stats"]["audit_stray_slots"] == 0, result["stats"]
        assert not first_differences_beyond_a_near_tie(result["tokens"], roomy["tokens"], roomy["gaps"])


def test_no_block_comes_back_while_the_requests_wait_for_a_sequence_not_a_block(qwen):
    """With every sequence slot taken (the long request and 5 short ones; max_num_seqs 6), the waiting requests wait
    for a slot: giving blocks back would move chunks to host memory for nothing."""
    full = run(qwen, TIGHT, max_num_seqs=6)
    assert full["lent"] > 0 and full["returned"] == 0 and full["stats"]["demotions"] == 0
    assert full["preempted"] == [] and full["free_after"] and full["reserved_after"] == 0
