"""PFlashService queues passes for its scoring thread: ``start`` returns at once (False beyond the queue's bound),
``poll`` hands out what a blocking ``compress`` gives once the pass ended, cancels, and leaves nothing held after
a cancellation or a deadline; the queue's depth and waiting time reach the metric store (the trained scorer,
CPU)."""

import threading
import time
from pathlib import Path
from types import SimpleNamespace

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


def test_loading_the_drafter_is_announced_with_the_bytes_it_holds_then_timed(luce_log):
    import torch

    from fixtures.trained import trained_model
    from vllm_luce.pflash.drafter_spec import DrafterSpec
    from vllm_luce.pflash.scorer import ScoringConfig
    from vllm_luce.pflash.service import load_scorer, weight_bytes

    spec = DrafterSpec.load(trained_model("scorer"))
    scorer = load_scorer(spec, torch.device("cpu"), torch.float32, ScoringConfig(early_exit_layers=1))
    held = sum(t.numel() * t.element_size() for t in scorer.w.values())
    assert held == weight_bytes(spec, 1, torch.float32)
    start, done = [r.getMessage() for r in luce_log.records]  # on a CPU nothing compiles: no warm-up lines
    assert start.endswith(f"PFlash: loading the drafter {spec.path.name} onto cpu ({held / 2**30:.2f} GiB, 1 layers)")
    assert "PFlash: drafter loaded in " in done


def test_on_a_gpu_the_kernel_warm_up_is_announced_with_its_expected_time(luce_log, monkeypatch):
    import torch

    from vllm_luce.pflash import service
    from vllm_luce.pflash.scorer import DrafterScorer, ScoringConfig

    warmed = []

    class Scorer(DrafterScorer):  # the GPU scorer without its weights: its warm-up only records the call
        def __init__(self, *args):
            pass

        def warm_up(self):
            warmed.append(True)

    spec = SimpleNamespace(num_layers=2, path=Path("scorer"), expected_shapes=lambda n: {"w": (1024, 1024)})
    monkeypatch.setattr(service, "DrafterScorer", Scorer)
    service.load_scorer(spec, torch.device("cuda"), torch.bfloat16, ScoringConfig())
    lines = [r.getMessage() for r in luce_log.records]
    assert warmed == [True] and len(lines) == 4, lines
    assert lines[0].endswith("PFlash: loading the drafter scorer onto cuda (0.00 GiB, 2 layers)")
    assert lines[2].endswith("PFlash: compiling and tuning the scoring kernels (prompts of 515, 4103, 4096 tokens, "
                             f"about {DrafterScorer.WARM_UP_SECONDS} s)")
    assert "PFlash: scoring kernels ready in " in lines[3]
