"""Where KVFlash decides, at positions fixed by the request alone (pure: no torch, no vLLM).

A paged request's attention reads the chunks resident when its step runs, and the queries of its latest tokens choose
them. Deciding at each step's start made a request's tokens follow how the scheduler cut its prompt and output into
steps, which other requests change: under load, greedy answers of paged requests parted from their answers alone.
So the pager decides only at **decision positions**, a function of the prompt's length and the pool's settings:

- **prefill** of a prompt longer than the pool: every ``epoch_tokens`` from 0 (``PagerConfig.epoch_tokens``: what
  fits beside the sinks and the recent tail); at each, room is made at once for the whole epoch;
- **the prompt's last token** (``prompt_end``), when the prompt is longer than the pool: a reselection with the
  queries of the tokens before it. The first answer token is sampled from the step that computes the prompt's last
  token, and chunks evicted during a long prefill may be what the question asks for; a reselection at the first
  decode step comes one token too late (the needle's first digit, ``benchmarks/kvflash_needle.py``). It costs
  one engine step per paged prompt;
- **decode** (positions from the prompt's length on): every chunk boundary (an eviction, once the pool is full), and
  the reselections: every multiple of ``interval(position)``, a power of two growing with the context
  (``tau_min`` or more, at most ``position / 45``), so that reselections cost about the same share of each step at
  any length.

The scheduler cuts each step of a request whose step would end beyond the pool at the next decision position
(``cut``; with asynchronous scheduling, where a step's start is known only up to the drafts in flight, a step that
may start before a decision takes one token), so every decision falls at a step's start, with the queries of the
tokens just before it: a resumed request's recompute, a step shared with others and a verify step of drafts all see
the residency the request alone would. Steps that end within the pool are never cut: nothing can be paged out
before the context outgrows the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

RESELECT_CONTEXT_SHARE = 45  # reselect about every context / 45 decoded tokens


@dataclass(frozen=True)
class Decisions:
    chunk_tokens: int
    pool_tokens: int
    epoch_tokens: int  # a multiple of chunk_tokens
    tau_min: int  # rounded down to a power of two
    prompt_tokens: int

    @property
    def paged_prompt(self) -> bool:
        return self.prompt_tokens > self.pool_tokens

    @property
    def prompt_end(self) -> int | None:
        """The prompt's last token, decided alone (a reselection), when the prompt is longer than the pool."""
        return self.prompt_tokens - 1 if self.paged_prompt else None

    def interval(self, position: int) -> int:
        """Decoded tokens between reselections around ``position``: the largest power of two up to position / 45,
        ``tau_min`` at least."""
        share = max(self.tau_min, position // RESELECT_CONTEXT_SHARE)
        return 1 << (share.bit_length() - 1)

    def reselects_at(self, position: int) -> bool:
        if position == self.prompt_end:
            return True
        return position > self.prompt_tokens and position % self.interval(position) == 0

    def next_reselection(self, position: int) -> int:
        """The first reselection position after ``position``."""
        if self.prompt_end is not None and position < self.prompt_end:
            return self.prompt_end
        p = max(position, self.prompt_tokens)
        while True:
            step = self.interval(p + 1)
            p = (p // step + 1) * step  # the next multiple of this interval; the interval may have grown there
            if p % self.interval(p) == 0:
                return p
            p -= 1

    def next_after(self, position: int) -> int:
        """The first decision position after ``position``."""
        if self.prompt_end is not None and position < self.prompt_end:
            return min((position // self.epoch_tokens + 1) * self.epoch_tokens, self.prompt_end)
        position = max(position, self.prompt_tokens - 1)  # a prompt within the pool: nothing to decide in it
        boundary = (position // self.chunk_tokens + 1) * self.chunk_tokens
        return min(boundary, self.next_reselection(position))

    def is_decision(self, position: int) -> bool:
        return position == 0 or self.next_after(position - 1) == position

    def room_until(self, start: int, end: int) -> int:
        """Tokens the pool makes room for in a step from ``start`` to ``end``: at a decision position, up to the next
        one (a whole prefill epoch, chunks paged out at once); between two, the step's own."""
        return max(end, self.next_after(start)) if self.is_decision(start) else end

    def cut(self, start: int, num_new: int, behind: int = 0) -> int:
        """How many of ``num_new`` tokens from ``start`` one step may take: up to the next decision position when
        the step would end beyond the pool, else all. ``behind``: the step may start up to that many tokens before
        ``start`` (asynchronous scheduling counts the drafts of the step in flight as accepted before it knows); where
        a decision lies in that span, the step takes one token, which never runs across a decision."""
        if start + num_new <= self.pool_tokens:
            return num_new
        if behind and self.next_after(start - behind) <= start:
            return min(num_new, 1)
        return min(num_new, self.next_after(start) - start)
