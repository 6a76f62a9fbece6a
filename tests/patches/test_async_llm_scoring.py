"""The API server's engine client starts PFlash's scoring pass and polls for its answer without holding its event
loop: other coroutines (other requests) run between polls; a rank that answers None, or a pass that never started,
leaves the prompt uncompressed."""

import asyncio

from vllm_luce.patches.async_llm import _score_in_background
from vllm_luce.pflash.worker import RESULT, START


class FakeEngine:
    """collective_rpc as two ranks answer it: rank 0 starts the pass, then is pending ``pending`` times."""

    def __init__(self, pending: int, started=True):
        self.pending, self.started, self.calls = pending, started, []

    async def collective_rpc(self, method, args=()):
        self.calls.append(method)
        await asyncio.sleep(0)
        if method == START:
            return [self.started, None]
        assert method == RESULT and args[0].startswith("req-7-")
        if self.pending:
            self.pending -= 1
            return [{"pending": True}, None]
        return [{"token_ids": [1, 2]}, None]


def test_the_client_polls_until_the_answer_while_other_coroutines_run():
    async def main():
        engine, ticks = FakeEngine(pending=5), []

        async def other_request():
            for _ in range(10):
                ticks.append(len(engine.calls))
                await asyncio.sleep(0.001)

        answer, _ = await asyncio.gather(_score_in_background(engine, "req-7", [5] * 10), other_request())
        return answer, engine.calls, ticks

    answer, calls, ticks = asyncio.run(main())
    assert answer == {"token_ids": [1, 2]}
    assert calls == [START] + [RESULT] * 6
    assert len(set(ticks)) > 2  # the other coroutine ran between the polls


def test_no_pass_started_means_no_answer():
    engine = FakeEngine(pending=0, started=None)
    assert asyncio.run(_score_in_background(engine, "req-7", [5])) is None
    assert engine.calls == [START]
