"""A pooled prompt's last token gets a step of its own (prompt_end.py), and the pager reselects before it."""

import pytest
import torch

from vllm_luce.kvflash.pager import PagerConfig, RequestPager, TensorStore
from vllm_luce.kvflash.policies import Scorer
from vllm_luce.kvflash.prompt_end import split_prompt_end

POOL = 512


@pytest.mark.parametrize("start,num_new,num_tokens,num_prompt,expected", [
    (1800, 248, 2048, 2048, 247),   # the last prefill chunk of a prompt longer than the pool: one short
    (2047, 1, 2048, 2048, 1),       # the last prompt token alone
    (1600, 192, 2048, 2048, 192),   # a chunk that does not end the prompt
    (0, 400, 400, 400, 400),        # a prompt that fits the pool: nothing was evicted, no extra step
    (2048, 1, 2049, 2048, 1),       # a decode step
    (2048, 16, 2049, 2048, 16),     # a verify step (drafts are not in num_tokens)
    (1900, 160, 2060, 2048, 159),   # a resumed request replaying prompt and outputs
])
def test_split(start, num_new, num_tokens, num_prompt, expected):
    assert split_prompt_end(start, num_new, num_tokens, num_prompt, POOL) == expected


def test_the_pager_reselects_before_the_prompts_last_token():
    """With the question's score known, the chunk it points to comes back before the last prompt token is
    computed, not one step later."""
    cfg = PagerConfig(pool_tokens=4 * 16, chunk_tokens=16, sink_chunks=1, recent_chunks=2)
    wanted, question = 3, {"read": False}  # the question's queries point to chunk 3 once it has been read
    policy = Scorer(lambda pager, chunks: torch.tensor(
        [10.0 if c == wanted and question["read"] else float(c) for c in chunks]))
    pager = RequestPager(cfg, TensorStore(cfg.pool_chunks, (2,)))
    for start in range(0, 16 * 10, 16):  # a 160-token prompt through a 64-token pool; token 159 left
        pager.prepare(start, 16 if start < 144 else 15, policy)
    assert wanted not in pager.resident
    question["read"] = True
    pager.prepare(159, 1, policy, prompt_end=True)
    assert wanted in pager.resident and pager.stats.page_ins == 1
