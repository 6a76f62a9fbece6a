"""Where a pooled request's prompt ends, KVFlash reselects before the last prompt token (pure).

A prompt longer than the pool was prefilled through the pool: chunks were evicted by queries of the
text before the question, so what the question needs may be on the host when the model reads it. The
first answer token is sampled from the step that computes the prompt's last token; a reselection on
the first decode step comes one token too late. So the last prompt token is scheduled in a step of its
own, and the pager reselects with the queries of the token before it (the question) and pages the
chosen chunks in before that step runs (``RequestPager.prepare(prompt_end=True)``).

Without it the first answer token misses what the question points at while later ones find it (the needle's
first digit, in ``benchmarks/kvflash_needle.py``; docs/benchmarks.md, "Measurements behind design choices in the
code"). It costs one extra engine step per pooled prompt.
"""

from __future__ import annotations


def split_prompt_end(start: int, num_new: int, num_tokens: int, num_prompt_tokens: int, pool_tokens: int) -> int:
    """How many of ``num_new`` tokens from ``start`` to schedule: one fewer when they would end a prefill
    (the prompt, or a resumed request's replay) longer than the pool with more than one token."""
    prefilling = start < max(num_prompt_tokens, num_tokens - 1)
    if prefilling and num_new > 1 and start + num_new >= num_tokens > pool_tokens:
        return num_new - 1
    return num_new
