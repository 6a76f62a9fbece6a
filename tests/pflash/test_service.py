"""PFlashService scores in the background: ``start`` returns at once, ``result`` says pending until the pass ends and
then gives what a blocking ``compress`` gives; one thread runs every pass (the trained scorer, CPU)."""

import threading

import pytest

from vllm_luce.pflash.selection import SelectionConfig
from vllm_luce.pflash.service import PFlashService


@pytest.fixture(scope="module")
def service():
    from fixtures.trained import trained_model

    return PFlashService(str(trained_model("scorer")), "cpu", SelectionConfig(chunk_tokens=32, keep_ratio=0.25))


def test_a_started_pass_is_pending_until_it_ends_then_answers_as_compress(service):
    ids = [(7 * i) % 4000 + 5 for i in range(2048)]
    gate = threading.Event()
    service._thread.submit(gate.wait)  # the service's one thread is busy: the started pass waits behind it
    service.start("a", ids)
    assert service.result("a") == {"pending": True}
    gate.set()
    service._jobs["a"][0].result(timeout=60)
    answer = service.result("a")
    blocking = service.compress(ids).as_dict()
    assert answer["token_ids"] == blocking["token_ids"] and 0 < len(answer["token_ids"]) < len(ids)
    assert answer["prompt_tokens"] == len(ids)
    with pytest.raises(KeyError, match="no scoring pass was started as 'a'"):
        service.result("a")  # answered once


def test_passes_run_on_the_services_one_thread(service):
    seen = []
    original = service._compress

    def recording(ids):
        seen.append(threading.current_thread().name)
        return original(ids)

    service._compress = recording
    try:
        service.compress(list(range(5, 1500)))
        service.start("b", list(range(5, 1500)))
        service._jobs["b"][0].result(timeout=60)
    finally:
        del service._compress
    assert len(seen) == 2 and all(name.startswith("luce-pflash") for name in seen)
