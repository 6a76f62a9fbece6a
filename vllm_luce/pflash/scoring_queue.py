"""PFlash's scoring queue (pure: no vLLM, no torch import): which prompts wait for the drafter, which one it
scores, what each is answered, and what the queue holds for whom.

Rank 0's worker scores one prompt at a time on a thread of its own (``service.py``); the API server starts a
pass per eligible prompt and collects the answers (``client.py``). The queue keeps that safe under load:

- **Bounded.** It holds at most ``max_prompts`` prompts waiting or being scored; ``submit`` refuses the next
  one, which the API server prefills uncompressed (outcome ``queue_full``).
- **Deadline.** A prompt is answered within ``timeout_s`` of its submission or not at all: one still waiting
  then never starts, and an answer nobody collected by then is thrown away. The API server stops waiting at
  the same timeout, counted from before it submitted, so it has given up first (outcome ``deadline``).
- **Cancellable.** ``cancel`` removes a waiting prompt, and drops a running pass's answer when the pass ends
  (the scorer has no safe point to stop at; the pass runs to its end, nobody receives it).
- **Accounting.** The seconds prompts waited before their pass started (or until they left the queue
  without one) and the prompts accepted, for ``/metrics``.

After ``cancel``, or once a ticket's deadline passed and its pass is not running, the queue holds nothing
for it. The queue is single-threaded; ``service.py`` calls it under a lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

WAITING, SCORING, ANSWERED = "waiting", "scoring", "answered"


@dataclass(frozen=True)
class QueueConfig:
    max_prompts: int = 32  # waiting or being scored
    timeout_s: float = 30.0  # from submission to answer

    def __post_init__(self):
        if self.max_prompts < 1 or not self.timeout_s > 0:
            raise ValueError(f"QueueConfig needs max_prompts >= 1 and timeout_s > 0, got {self}")


@dataclass
class Entry:
    payload: Any
    submitted: float
    deadline: float
    state: str = WAITING
    answer: Any = None
    cancelled: bool = False  # while scoring: its answer is dropped when the pass ends

    def start(self) -> Any:
        """Now being scored: hand over the payload (the queue keeps no copy)."""
        self.state, payload, self.payload = SCORING, self.payload, None
        return payload

    def answered(self, answer: Any) -> None:
        self.state, self.answer = ANSWERED, answer

    def cancel(self) -> None:
        self.cancelled = True


class ScoringQueue:
    def __init__(self, config: QueueConfig = QueueConfig(), clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.clock = clock
        self._entries: dict[str, Entry] = {}  # in submission order
        self.accepted = 0  # prompts submitted and taken
        self.refused = 0  # prompts submitted beyond max_prompts
        self.cancelled = 0
        self.expired = 0  # dropped at their deadline: never started, or answered and never collected
        self.wait_s = 0.0  # seconds accepted prompts waited before their pass started (or left unscored)

    @property
    def active(self) -> int:
        """Prompts waiting or being scored: what ``max_prompts`` bounds."""
        return sum(e.state != ANSWERED for e in self._entries.values())

    @property
    def held(self) -> int:
        """Tickets the queue holds anything for: waiting, being scored, or answered and not yet collected."""
        return len(self._entries)

    def state(self, ticket: str) -> str | None:
        entry = self._entries.get(ticket)
        return None if entry is None else entry.state

    def submit(self, ticket: str, payload: Any) -> bool:
        """Queue ``payload`` as ``ticket``; False (nothing held) when ``max_prompts`` prompts are already in."""
        self.expire()
        if ticket in self._entries:
            raise ValueError(f"PFlash: a scoring pass is already queued as {ticket!r}")
        if self.active >= self.config.max_prompts:
            self.refused += 1
            return False
        now = self.clock()
        self._entries[ticket] = Entry(payload, now, now + self.config.timeout_s)
        self.accepted += 1
        return True

    def next_pass(self) -> tuple[str, Any] | None:
        """The oldest waiting prompt, now being scored, as (ticket, payload); None when none waits."""
        self.expire()
        for ticket, entry in self._entries.items():
            if entry.state == WAITING:
                self.wait_s += self.clock() - entry.submitted
                return ticket, entry.start()
        return None

    def finish(self, ticket: str, answer: Any) -> None:
        """The pass of ``ticket`` ended with ``answer``: kept for ``collect``, or dropped when the ticket was
        cancelled meanwhile or its deadline passed (its client has stopped waiting)."""
        entry = self._entries.get(ticket)
        if entry is None or entry.state != SCORING:
            raise ValueError(f"PFlash: no scoring pass is running as {ticket!r}")
        if entry.cancelled or self.clock() >= entry.deadline:
            self.expired += not entry.cancelled
            del self._entries[ticket]
            return
        entry.answered(answer)

    def cancel(self, ticket: str) -> bool:
        """Drop ``ticket``: a waiting prompt leaves the queue, an answer is discarded, a running pass's answer
        will be. False when the queue holds nothing for it (already answered, expired, or never queued)."""
        entry = self._entries.get(ticket)
        if entry is None or entry.cancelled:
            return False
        self.cancelled += 1
        if entry.state == SCORING:
            entry.cancel()
            return True
        if entry.state == WAITING:
            self.wait_s += self.clock() - entry.submitted
        del self._entries[ticket]
        return True

    def collect(self, tickets: Iterable[str]) -> dict[str, Any]:
        """The answers ready among ``tickets``, each handed out once (the queue then holds nothing for it);
        a ticket the queue holds nothing for maps to None. Tickets still waiting or scoring are left out."""
        self.expire()
        out = {}
        for ticket in tickets:
            entry = self._entries.get(ticket)
            if entry is None:
                out[ticket] = None
            elif entry.state == ANSWERED:
                out[ticket] = entry.answer
                del self._entries[ticket]
        return out

    def expire(self) -> None:
        """Drop what passed its deadline and is not being scored (a running pass is settled by ``finish``)."""
        now = self.clock()
        for ticket in [t for t, e in self._entries.items() if e.state != SCORING and now >= e.deadline]:
            entry = self._entries.pop(ticket)
            if entry.state == WAITING:
                self.wait_s += entry.deadline - entry.submitted
            self.expired += 1

    def seconds_to_next_deadline(self) -> float | None:
        """How long until ``expire`` next has something to drop; None when nothing could expire."""
        pending = [e.deadline for e in self._entries.values() if e.state != SCORING]
        return None if not pending else max(0.0, min(pending) - self.clock())


# The API server's poller asks rank 0 for every pending answer in one call, ``poll_delay(quiet_s)`` after its
# previous call, ``quiet_s`` being the time since the last answer arrived (or since the first ticket was
# submitted): a tenth of it, within [POLL_MIN_S, POLL_MAX_S]. An answer then waits at most a tenth of its pass (or
# POLL_MAX_S) to be collected, and a long pass costs ~20 calls a second, however many prompts wait behind it.
POLL_MIN_S, POLL_MAX_S, POLL_SHARE = 0.005, 0.05, 0.1


def poll_delay(quiet_s: float) -> float:
    return min(POLL_MAX_S, max(POLL_MIN_S, POLL_SHARE * quiet_s))
