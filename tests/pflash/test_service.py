"""PFlashService queues passes for its scoring thread: ``start`` returns at once (False beyond the queue's bound),
``poll`` hands out what a blocking ``compress`` gives once the pass ended, cancels, and leaves nothing held after
a cancellation or a deadline; the queue's depth and waiting time reach the metric store (the trained scorer,
CPU)."""

import threading
import time

import pytest

from vllm_luce import metrics
from vllm_luce.pflash.scoring_queue import SCORING, QueueConfig
from vllm_luce.pflash.selection import SelectionConfig
from vllm_luce.pflash.service import PFlashService

LABELS = {"model_name": "test-service"}
SHORT = list(range(5, 600))


def _service(queue: QueueConfig, labels=None) -> PFlashService:
    from fixtures.trained import trained_model

    return PFlashService(str(trained_model("scorer")), "cpu", SelectionConfig(chunk_tokens=32, keep_ratio=0.25),
                         queue=queue, metric_labels=labels)


@pytest.fixture(scope="module")
def service():
    s = _service(QueueConfig(max_prompts=2, timeout_s=60.0), LABELS)
    yield s
    s.close()


def wait_for(condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def answer_of(service, ticket):
    found = {}
    wait_for(lambda: found.update(service.poll([ticket])) or ticket in found)
    return found[ticket]


def test_a_queued_pass_is_left_out_until_it_ends_then_answers_as_compress(service):
    ids = [(7 * i) % 4000 + 5 for i in range(2048)]
    with service._scoring:  # a pass is running: the queued one waits behind it
        assert service.start("a", ids)
        assert service.poll(["a"]) == {}
    answer = answer_of(service, "a")
    blocking = service.compress(ids).as_dict()
    assert answer["token_ids"] == blocking["token_ids"] and 0 < len(answer["token_ids"]) < len(ids)
    assert answer["prompt_tokens"] == len(ids)
    assert "no scoring pass is held as 'a'" in service.poll(["a"])["a"]["error"]  # handed out once
    assert service.queue.held == 0


def test_beyond_the_bound_a_prompt_is_refused_and_cancelled_passes_leave_nothing_held(service):
    with service._scoring:  # the thread takes "a" and blocks on the scorer
        assert service.start("a", SHORT)
        wait_for(lambda: service.queue.state("a") == SCORING)
        assert service.start("b", SHORT)
        assert not service.start("c", SHORT)  # two in: waiting or scoring
        assert service.poll([], cancels=["a", "b"]) == {}  # b leaves at once; a's pass goes on
        assert service.queue.held == 1
        assert service.start("c", SHORT)  # b's place is free
        service.poll([], cancels=["c"])
    wait_for(lambda: service.queue.held == 0)  # a's pass ended and its answer went nowhere
    assert "no scoring pass is held" in service.poll(["a"])["a"]["error"]


def test_depth_and_waiting_time_reach_the_metric_store(service):
    def value(kind, name):
        return metrics.STORE.values[kind].get((name, tuple(LABELS.items())))

    before = value("counter", "pflash_queued_prompts") or 0
    with service._scoring:
        service.start("m1", SHORT)
        service.start("m2", SHORT)
        wait_for(lambda: value("gauge", "pflash_queue_depth") == 2)
        time.sleep(0.05)
    answer_of(service, "m1"), answer_of(service, "m2")
    wait_for(lambda: value("gauge", "pflash_queue_depth") == 0)
    assert value("counter", "pflash_queued_prompts") == before + 2
    assert value("counter", "pflash_queue_wait_seconds") >= 0.05  # m2 waited for m1's pass at least


def test_past_the_deadline_a_waiting_prompt_never_starts_and_an_answer_nobody_collects_is_dropped():
    service = _service(QueueConfig(max_prompts=4, timeout_s=1.0))
    try:
        with service._scoring:
            service.start("a", SHORT)
            wait_for(lambda: service.queue.state("a") == SCORING)
            service.start("b", SHORT)
            time.sleep(1.1)
            assert "no scoring pass is held as 'b'" in service.poll(["b"])["b"]["error"]  # never started
        wait_for(lambda: service.queue.held == 0, timeout=30)  # a ended after its deadline: dropped
        assert service.start("c", SHORT)
        wait_for(lambda: service.queue.state("c") is None, timeout=30)  # answered, never collected, then dropped
        assert service.queue.expired == 3
    finally:
        service.close()


def test_queued_passes_run_on_the_services_thread_and_compress_in_the_callers(service):
    seen = []
    original = service._compress

    def recording(ids):
        seen.append(threading.current_thread().name)
        return original(ids)

    service._compress = recording
    try:
        service.compress(SHORT)
        service.start("t", SHORT)
        answer_of(service, "t")
    finally:
        del service._compress
    assert seen == [threading.current_thread().name, "luce-pflash"]
