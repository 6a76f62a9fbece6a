"""The API server's scoring client against a fake engine whose rank 0 runs the real scoring queue (rank 1 answers
None, as at TP=2): one poller asks for every waiting prompt in one call at a backing-off cadence while other
coroutines run; a full queue, a deadline and a cancelled request each end as their outcome, and after a
cancellation or a deadline the worker holds nothing for the prompt."""

import asyncio
from types import SimpleNamespace

import pytest

from vllm_luce import metrics
from vllm_luce.patches.async_llm import _make_wrapper
from vllm_luce.pflash.client import DEADLINE, QUEUE_FULL, ScoringClient
from vllm_luce.pflash.scoring_queue import POLL_MIN_S, QueueConfig, ScoringQueue
from vllm_luce.pflash.worker import POLL, START

MODEL = "fake-client-model"


class FakeEngine:
    """``collective_rpc`` as the worker extension answers it on two ranks."""

    def __init__(self, max_prompts=8, timeout_s=60.0, start_delay=0.0):
        self.queue = ScoringQueue(QueueConfig(max_prompts, timeout_s))
        self.calls, self.start_delay = [], start_delay
        self.vllm_config = SimpleNamespace(
            additional_config={"luce": {"pflash": {"drafter": "/d", "min_prompt_tokens": 4,
                                                   "queue_timeout_s": timeout_s}}},
            model_config=SimpleNamespace(served_model_name=MODEL))

    async def collective_rpc(self, method, args=()):
        """The worker acts when the call is sent; the reply comes ``start_delay`` later for a start."""
        self.calls.append((method, args))
        if method == START:
            reply = {"accepted": self.queue.submit(*args)}
        else:
            assert method == POLL
            tickets, cancels = args
            for ticket in cancels:
                self.queue.cancel(ticket)
            found = self.queue.collect(tickets)
            reply = {"answers": {t: {"error": "gone"} if a is None else a for t, a in found.items()}}
        await asyncio.sleep(self.start_delay if method == START else 0)
        return [reply, None]

    def end_pass(self):
        ticket, ids = self.queue.next_pass()
        self.queue.finish(ticket, answer_for(ids))

    def polls(self):
        return [args for method, args in self.calls if method == POLL]


def answer_for(ids):
    return {"token_ids": ids[:2], "prompt_tokens": len(ids), "n_chunks": 4, "kept_chunks": 1, "anchor_chunks": 0,
            "score_ms": 1.0, "select_ms": 1.0, "cross_tokenizer": False}


def outcomes():
    return {dict(labels)["outcome"]: value for (name, labels), value in metrics.STORE.values["counter"].items()
            if name == "pflash_prompts" and dict(labels).get("model_name") == MODEL}


def waiting():
    """The API server's gauge of requests waiting on a scoring answer."""
    return metrics.STORE.values["gauge"].get(("pflash_waiting_requests", (("model_name", MODEL),)))


async def settle(engine, seconds=0.1):
    """Let the poller run its next calls."""
    await asyncio.sleep(seconds)


def test_one_poller_asks_for_every_waiting_prompt_in_one_call_while_other_coroutines_run():
    async def main():
        engine = FakeEngine()
        client = ScoringClient(engine, 60.0)
        ticks = []

        async def other_request():
            while len(ticks) < 30:
                ticks.append(len(engine.calls))
                await asyncio.sleep(0.01)

        tasks = [asyncio.create_task(client.score(f"r{i}", [i] * 10)) for i in range(8)]
        await asyncio.gather(other_request(), settle(engine, 0.3))
        polls, held = engine.polls(), waiting()
        for _ in range(8):
            engine.end_pass()
        answers = await asyncio.gather(*tasks)
        return answers, polls, ticks, engine, held

    answers, polls, ticks, engine, held = asyncio.run(main())
    assert held == 8 and waiting() == 0
    assert [a["token_ids"] for a in answers] == [[i, i] for i in range(8)]
    assert len({tuple(sorted(tickets)) for tickets, _ in polls[1:]}) == 1 and len(polls[-1][0]) == 8
    # polling every 5 ms per prompt made ~480 calls in these 0.3 s; one poller backing off makes a few dozen
    assert 5 < len(polls) < 0.3 / POLL_MIN_S / 2
    assert len(set(ticks)) > 5  # the other coroutine ran between the calls
    assert engine.queue.held == 0


def test_beyond_the_bound_the_prompt_is_not_queued_and_nothing_polls():
    async def main():
        engine = FakeEngine(max_prompts=1)
        client = ScoringClient(engine, 60.0)
        first = asyncio.create_task(client.score("r0", [1] * 10))
        await settle(engine, 0.02)
        refused = await client.score("r1", [2] * 10)
        engine.end_pass()
        return refused, await first, engine

    refused, first, engine = asyncio.run(main())
    assert refused == QUEUE_FULL and first["token_ids"] == [1, 1]
    assert all(not t.startswith("r1") for tickets, _ in engine.polls() for t in tickets)


def test_a_pass_not_ended_by_the_deadline_is_given_up_and_cancelled_on_the_worker():
    async def main():
        engine = FakeEngine()  # the worker's own deadline, counted from later, is not what drops it here
        answer = await ScoringClient(engine, 0.1).score("r0", [1] * 10)
        await settle(engine)
        return answer, engine

    answer, engine = asyncio.run(main())
    assert answer == DEADLINE
    assert engine.polls()[-1][1] and engine.queue.held == 0 and engine.queue.cancelled == 1


@pytest.mark.parametrize("where", ["waiting", "starting"])
def test_a_request_that_goes_away_cancels_its_pass_and_the_worker_holds_nothing(where):
    async def main():
        engine = FakeEngine(start_delay=0.05 if where == "starting" else 0.0)
        client = ScoringClient(engine, 60.0)
        before = outcomes().get("cancelled", 0)
        task = asyncio.create_task(client.score("r0", [1] * 10))
        await asyncio.sleep(0.01 if where == "starting" else 0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await settle(engine)
        return engine, outcomes().get("cancelled", 0) - before

    engine, cancelled = asyncio.run(main())
    sent = [c for _, cancels in engine.polls() for c in cancels]
    assert cancelled == 1 and len(sent) == 1 and sent[0].startswith("r0-") and waiting() == 0
    assert engine.queue.accepted == 1 and engine.queue.held == 0


def test_an_engine_driven_from_one_event_loop_after_another_keeps_scoring():
    engine = FakeEngine()
    client = ScoringClient(engine, 60.0)

    async def one(request_id):
        task = asyncio.create_task(client.score(request_id, [1] * 10))
        await settle(engine, 0.05)  # the poller has waited on its wake-up event
        engine.end_pass()
        return await task

    assert asyncio.run(one("r0"))["token_ids"] == [1, 1]
    assert asyncio.run(one("r1"))["token_ids"] == [1, 1]
    assert engine.queue.held == 0


def test_a_failed_poll_leaves_the_waiting_prompts_uncompressed():
    class Broken(FakeEngine):
        async def collective_rpc(self, method, args=()):
            if method == POLL:
                raise RuntimeError("engine core died")
            return await super().collective_rpc(method, args)

    answer = asyncio.run(ScoringClient(Broken(), 60.0).score("r0", [1] * 10))
    assert "engine core died" in answer["error"]


class Params(SimpleNamespace):
    def __init__(self, **extra):
        super().__init__(structured_outputs=None, prompt_logprobs=None, extra_args=extra or None)


def test_the_add_request_patch_passes_the_answer_on_and_a_cancelled_request_never_reaches_vllm():
    added = []

    async def original(engine, request_id, prompt, params, *args, **kwargs):
        added.append((request_id, prompt["prompt_token_ids"]))

    add_request = _make_wrapper(original)
    prompt = {"type": "token", "prompt_token_ids": list(range(10, 20))}

    async def main():
        engine = FakeEngine(max_prompts=1)
        compressed = asyncio.create_task(add_request(engine, "a", prompt, Params()))
        await settle(engine, 0.02)
        await add_request(engine, "full", prompt, Params())  # the queue holds "a": prefilled as sent
        cancelled = asyncio.create_task(add_request(engine, "gone", prompt, Params()))
        engine.end_pass()
        await compressed
        await settle(engine, 0.02)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await settle(engine)
        return engine, ScoringClient.of(engine)

    before = outcomes()
    engine, client = asyncio.run(main())
    after = outcomes()
    assert added == [("full", prompt["prompt_token_ids"]), ("a", [10, 11])]
    assert {o: after[o] - before.get(o, 0) for o in after if after[o] != before.get(o, 0)} == {
        "compressed": 1, "queue_full": 1, "cancelled": 1}
    assert engine.queue.held == 0 and client.timeout_s == 60.0 and not client.pending


def test_a_client_supplied_skip_reason_cannot_create_a_series():
    async def original(engine, request_id, prompt, params, *args, **kwargs):
        pass

    add_request = _make_wrapper(original)
    prompt = {"type": "token", "prompt_token_ids": list(range(10, 20))}
    engine = FakeEngine()
    before = outcomes()
    for value in ("tools", "x-1", "x-2", "'); drop", 7, ["a"]):
        asyncio.run(add_request(engine, "r", prompt, Params(luce_pflash_skip=value)))
    after = outcomes()
    assert set(after) - set(before) <= {"skipped_tools", "skipped_other"}
    assert after["skipped_other"] - before.get("skipped_other", 0) == 5
    assert after["skipped_tools"] - before.get("skipped_tools", 0) == 1
    assert engine.calls == []  # nothing was scored
