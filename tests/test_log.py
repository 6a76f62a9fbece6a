"""A long startup step's two lines (``vllm_luce/log.py``, ``StartupStep``): before it, what starts, its size and the
expected time where a rate is known; after it, the time taken."""

import re

from vllm_luce.log import StartupStep


def test_the_start_line_has_size_and_expected_time_and_the_done_line_the_time_taken(luce_log):
    step = StartupStep("KVFlash: pinning host memory for paged-out KV", "17.5 GiB", 15.9)
    took = step.done("KVFlash: pinned 17.5 GiB")
    start, done = [r.getMessage() for r in luce_log.records]
    assert start.endswith(": KVFlash: pinning host memory for paged-out KV (17.5 GiB, about 16 s)")
    assert re.search(r": KVFlash: pinned 17\.5 GiB in \d+\.\d s$", done) and took >= 0


def test_without_a_known_rate_the_start_line_gives_the_size_alone(luce_log):
    StartupStep("DFlash: converting", "1.20 GiB")
    assert luce_log.records[0].getMessage().endswith(": DFlash: converting (1.20 GiB)")
