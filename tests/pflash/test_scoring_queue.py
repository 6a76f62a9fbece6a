"""PFlash's scoring queue (pure core, a fake clock): bounded, deadline, cancellation, accounting; after a ticket is
cancelled, expired or collected the queue holds nothing for it."""

import re

import pytest

from vllm_luce.config import LuceConfig, LuceConfigError
from vllm_luce.pflash.scoring_queue import (ANSWERED, POLL_MAX_S, POLL_MIN_S, SCORING, WAITING, QueueConfig,
                                            ScoringQueue, poll_delay)
from vllm_luce.pflash.settings import queue_config


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def queue(max_prompts=2, timeout_s=10.0):
    clock = Clock()
    return ScoringQueue(QueueConfig(max_prompts, timeout_s), clock), clock


def test_passes_run_in_submission_order_and_each_answer_is_handed_out_once():
    q, clock = queue(max_prompts=3)
    for t in "abc":
        assert q.submit(t, [ord(t)])
    assert q.next_pass() == ("a", [97])
    assert (q.state("a"), q.state("b")) == (SCORING, WAITING)
    q.finish("a", {"token_ids": [1]})
    assert q.state("a") == ANSWERED
    assert q.collect(["a", "b"]) == {"a": {"token_ids": [1]}}  # b still waits: left out
    assert q.collect(["a"]) == {"a": None}  # handed out once: held no more
    assert q.next_pass() == ("b", [98]) and q.held == 2


def test_beyond_max_prompts_a_prompt_is_refused_and_nothing_is_held_for_it():
    q, _ = queue(max_prompts=2)
    assert q.submit("a", 1) and q.submit("b", 2)
    assert not q.submit("c", 3)
    assert (q.held, q.accepted, q.refused) == (2, 2, 1) and q.state("c") is None
    q.next_pass()
    q.finish("a", "answer-a")  # answered, not collected: no longer counted against the bound
    assert q.active == 1 and q.held == 2
    assert q.submit("c", 3)


def test_a_duplicate_ticket_is_an_error():
    q, _ = queue()
    q.submit("a", 1)
    with pytest.raises(ValueError, match="already queued as 'a'"):
        q.submit("a", 2)


def test_a_waiting_prompt_past_its_deadline_never_starts():
    q, clock = queue(max_prompts=3, timeout_s=10.0)
    q.submit("a", 1)
    clock.now += 4
    q.submit("b", 2)
    assert q.next_pass() == ("a", 1)
    clock.now += 7  # b has waited 7 s; a has run 7 s
    assert q.seconds_to_next_deadline() == pytest.approx(3.0)
    clock.now += 3
    assert q.next_pass() is None and q.state("b") is None and q.expired == 1
    assert q.state("a") == SCORING  # a running pass is settled when it ends
    q.finish("a", "late")
    assert q.held == 0 and q.expired == 2  # its client stopped waiting at the deadline: dropped, not kept
    assert q.wait_s == pytest.approx(4.0 + 10.0)  # a started 4 s after it came; b waited its whole timeout


def test_an_answer_nobody_collects_is_dropped_at_the_deadline():
    q, clock = queue(timeout_s=10.0)
    q.submit("a", 1)
    q.next_pass()
    clock.now += 2
    q.finish("a", "answer")
    assert q.seconds_to_next_deadline() == pytest.approx(8.0)
    clock.now += 8
    assert q.collect(["a"]) == {"a": None} and q.held == 0 and q.seconds_to_next_deadline() is None


def test_cancel_removes_a_waiting_prompt_and_drops_a_running_pass_answer():
    q, clock = queue(max_prompts=3)
    for t in "abc":
        q.submit(t, t)
    assert q.next_pass() == ("a", "a")
    clock.now += 1.5
    assert q.cancel("b")  # waiting: gone now, it waited 1.5 s
    assert q.cancel("a")  # scoring: held until the pass ends
    assert not q.cancel("a") and not q.cancel("never")
    assert (q.state("a"), q.state("b"), q.held) == (SCORING, None, 2)
    q.finish("a", "answer")
    assert q.held == 1 and q.collect(["a"]) == {"a": None}  # the answer went nowhere
    assert q.next_pass() == ("c", "c")
    q.finish("c", "c-answer")
    assert q.cancel("c") and q.held == 0  # answered, not yet collected: discarded
    assert (q.cancelled, q.expired) == (3, 0)
    assert q.wait_s == pytest.approx(1.5 + 1.5)  # b until its cancel, c until its start


def test_finish_of_a_pass_that_is_not_running_is_an_error():
    q, _ = queue()
    q.submit("a", 1)
    with pytest.raises(ValueError, match="no scoring pass is running as 'a'"):
        q.finish("a", "x")


def test_config_is_checked():
    with pytest.raises(ValueError, match="max_prompts >= 1"):
        QueueConfig(0, 1.0)
    with pytest.raises(ValueError, match="timeout_s > 0"):
        QueueConfig(1, 0.0)


def test_the_settings_reach_the_queue_and_bad_values_name_the_key():
    pf = LuceConfig.from_sources({"luce": {"pflash": {"drafter": "/d", "max_queued_prompts": 4,
                                                      "queue_timeout_s": 2.5}}}, {}).pflash
    assert queue_config(pf) == QueueConfig(4, 2.5)
    defaults = LuceConfig.from_sources({"luce": {"pflash": {"drafter": "/d"}}}, {}).pflash
    assert queue_config(defaults) == QueueConfig()
    for key, value, accepted in (("max_queued_prompts", 0, "an integer >= 1"), ("max_queued_prompts", 1.5, ""),
                                 ("queue_timeout_s", 0, "a number > 0 (seconds)"), ("queue_timeout_s", "9", "")):
        message = f"^luce.pflash.{key}: got {re.escape(repr(value))}; expected {re.escape(accepted)}"
        with pytest.raises(LuceConfigError, match=message):
            LuceConfig.from_sources({"luce": {"pflash": {"drafter": "/d", key: value}}}, {})


def test_poll_cadence_is_a_tenth_of_the_quiet_time_within_bounds():
    assert poll_delay(0.0) == POLL_MIN_S
    assert poll_delay(0.2) == pytest.approx(0.02)
    assert poll_delay(60.0) == POLL_MAX_S
    # a 2 s pass costs ~60 polls in all, where polling every 5 ms cost 400
    t, polls = 0.0, 0
    while t < 2.0:
        t += poll_delay(t)
        polls += 1
    assert polls < 70 and t - 2.0 <= POLL_MAX_S
