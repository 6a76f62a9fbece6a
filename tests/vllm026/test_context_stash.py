"""The plain steps' context stash (``vllm_luce/vllm026/context_stash.py``): what is kept, in which order, and
what it refuses."""

import pytest
import torch

from vllm_luce.vllm026.context_stash import ContextStash


def step(rows, tokens, base):
    """A step's padded features (``rows``), and the first ``tokens`` rows' positions and slots."""
    features = torch.arange(base, base + rows * 3, dtype=torch.float32).view(rows, 3)
    return features, torch.arange(base, base + tokens), torch.arange(base, base + tokens) * 10


def test_commits_keep_the_first_rows_of_each_step_in_step_order():
    stash = ContextStash(8)
    kept = []
    for rows, tokens, base in ((4, 3, 0), (2, 2, 100), (3, 1, 200)):
        features, positions, slots = step(rows, tokens, base)
        assert stash.stage(features)
        stash.commit(positions, slots)
        kept.append((features[:tokens], positions, slots))
    features, positions, slots = stash.drain()
    assert torch.equal(features, torch.cat([k[0] for k in kept]))
    assert torch.equal(positions, torch.cat([k[1] for k in kept]))
    assert torch.equal(slots, torch.cat([k[2] for k in kept]))
    assert stash.drain() is None and stash.used == 0


def test_a_step_that_does_not_fit_is_refused_untouched():
    stash = ContextStash(5)
    features, positions, slots = step(4, 4, 0)
    assert stash.stage(features)
    stash.commit(positions, slots)
    assert not stash.stage(step(2, 2, 50)[0])  # padded rows count: 4 + 2 > 5
    assert stash.staged == 0 and stash.used == 4
    assert torch.equal(stash.drain()[0], features)


def test_slots_per_drafter_layer_come_back_as_a_list():
    stash = ContextStash(4)
    features, positions, slots = step(2, 2, 0)
    assert stash.stage(features)
    stash.commit(positions, [slots, slots + 1, slots + 2])
    _, _, back = stash.drain()
    assert isinstance(back, list) and [torch.equal(b, slots + i) for i, b in enumerate(back)] == [True] * 3
    assert stash.stage(features)
    stash.commit(positions, [slots, slots, slots])
    assert stash.stage(features)
    with pytest.raises(ValueError, match="changed form"):
        stash.commit(positions, slots)


def test_misuse_is_refused():
    with pytest.raises(ValueError, match="at least one token"):
        ContextStash(0)
    stash = ContextStash(4)
    features, positions, slots = step(2, 2, 0)
    assert stash.stage(features)
    with pytest.raises(ValueError, match="3 tokens after 2 staged"):
        stash.commit(torch.arange(3), torch.arange(3))
    assert not stash.stage(torch.zeros(3))  # one-dimensional features are not a step's
    stash.unstage()
    assert stash.staged == 0 and stash.drain() is None


def test_other_features_while_tokens_are_kept_are_refused():
    stash = ContextStash(8)
    features, positions, slots = step(2, 2, 0)
    assert stash.stage(features)
    stash.commit(positions, slots)
    assert not stash.stage(torch.zeros(1, 5))  # another width: the kept tokens are written first
    stash.drain()
    assert stash.stage(torch.zeros(1, 5))
