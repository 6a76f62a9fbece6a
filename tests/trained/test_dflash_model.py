"""The trainable DFlash drafter sees what vLLM's drafter sees (fixtures/dflash_model.py)."""

import pytest
import torch

from fixtures import dflash_model as D
from fixtures.dflash_drafter import drafter_state_dict

TARGET = {"hidden_size": 128, "num_hidden_layers": 4, "vocab_size": 64, "max_position_embeddings": 512,
          "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0,
          "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
BLOCK = 4


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    cfg = D.drafter_config(target_cfg=TARGET, target_layer_ids=[0, 2], block_size=BLOCK, num_layers=2,
                           mask_token_id=3, intermediate_size=96)
    drafter = D.DFlashDrafter(cfg, TARGET["hidden_size"]).eval()
    embed = torch.nn.Embedding(64, 128)
    return cfg, drafter, embed


def run(setup, features, tokens, anchors):
    _, drafter, embed = setup
    with torch.no_grad():
        return drafter(features, embed(tokens), anchors, BLOCK)


def inputs(T=40):
    g = torch.Generator().manual_seed(1)
    features = torch.randn(1, T, 256, generator=g)
    anchors = torch.tensor([[9, 25]])
    tokens = torch.randint(4, 64, (1, 2 * BLOCK), generator=g)
    return features, tokens, anchors


def test_checkpoint_names_are_z_labs(setup):
    cfg, drafter, _ = setup
    assert set(drafter.state_dict()) == set(drafter_state_dict(cfg, TARGET["hidden_size"], seed=0))


def test_block_sees_only_context_before_its_anchor(setup):
    features, tokens, anchors = inputs()
    base = run(setup, features, tokens, anchors)
    later = features.clone()
    later[:, 9:] += 5.0  # the anchor's own feature and everything after it
    out = run(setup, later, tokens, anchors)
    assert torch.allclose(out[:, :BLOCK], base[:, :BLOCK], atol=1e-5)  # block at anchor 9: unchanged
    assert not torch.allclose(out[:, BLOCK:], base[:, BLOCK:], atol=1e-3)  # block at 25 sees 9..24
    earlier = features.clone()
    earlier[:, 8] += 5.0
    assert not torch.allclose(run(setup, earlier, tokens, anchors)[:, :BLOCK], base[:, :BLOCK], atol=1e-3)


def test_blocks_are_independent_and_non_causal_inside(setup):
    features, tokens, anchors = inputs()
    base = run(setup, features, tokens, anchors)
    other = tokens.clone()
    other[0, BLOCK:] = 5  # rewrite the second block
    out = run(setup, features, other, anchors)
    assert torch.allclose(out[:, :BLOCK], base[:, :BLOCK], atol=1e-5)
    last = tokens.clone()
    last[0, BLOCK - 1] = 7 if tokens[0, BLOCK - 1] != 7 else 8  # the block's last slot
    out = run(setup, features, last, anchors)
    assert not torch.allclose(out[:, 0], base[:, 0], atol=1e-4)  # slot 0 attends to slot 3


def test_position_weights_anchors_and_acceptance():
    w = D.position_weights(16, 7.0, "cpu")
    assert w.shape == (15,) and w[0] == 1 and torch.all(w[1:] < w[:-1])
    anchors = D.sample_anchors(torch.Generator().manual_seed(0), 3, 20, 100, 16)
    assert anchors.shape == (3, 20) and anchors.min() >= 1 and anchors.max() <= 100 - 16
    assert all(len(set(row.tolist())) == 20 for row in anchors)
    drafts = torch.tensor([[1, 2, 3], [9, 2, 3], [1, 2, 9]])
    labels = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    assert D.acceptance_lengths(drafts, labels).tolist() == [4, 1, 3]
