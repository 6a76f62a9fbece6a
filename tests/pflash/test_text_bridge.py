"""Cross-tokenizer mapping: kept drafter spans become whole words of the target's tokens."""

from __future__ import annotations

import pytest

from fixtures.trained import trained_model
from vllm_luce.pflash.text_bridge import BridgedPrompt, TextBridge, char_spans


def test_char_spans_widen_to_whitespace_and_merge():
    text = "alpha beta_gamma delta epsilon"
    # drafter tokens: "alpha", " beta", "_gam", "ma", " delta", " epsilon"
    offsets = [(0, 5), (5, 10), (10, 14), (14, 16), (16, 22), (22, 30)]
    bridged = BridgedPrompt(text, list(range(6)), offsets)
    assert char_spans(bridged, [(2, 3)]) == [(6, 16)]  # "_gam" -> the whole "beta_gamma"
    assert char_spans(bridged, [(0, 1), (2, 3)]) == [(0, 16)]
    assert char_spans(bridged, [(5, 6)]) == [(23, 30)]  # the leading space is not a word


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    from transformers import AutoTokenizer

    from fixtures.tiny_models import build_tokenizer

    target = AutoTokenizer.from_pretrained(str(trained_model("tokenizer")))
    drafter = AutoTokenizer.from_pretrained(str(build_tokenizer(tmp_path_factory.mktemp("tok"))))
    return TextBridge(target, drafter)


def test_round_trip_of_everything_is_the_text(bridge):
    text = 'def f(x):\n    KEY_123 = "456789"\n    return x\n'
    ids = bridge.target.encode(text, add_special_tokens=False)
    bridged = bridge.to_drafter(ids)
    assert bridged.text == text and bridged.drafter_ids != ids
    kept = bridge.to_target(bridged, [(0, len(bridged.drafter_ids))])
    assert bridge.target.decode(kept) == text


def test_a_kept_needle_survives_whole(bridge):
    text = "x = 1\n" * 40 + 'KEY_123 = "456789"\n' + "y = 2\n" * 40
    bridged = bridge.to_drafter(bridge.target.encode(text, add_special_tokens=False))
    start = text.index("456789")
    i = next(n for n, (a, b) in enumerate(bridged.offsets) if a <= start + 2 < b)  # a token inside the digits
    kept = bridge.target.decode(bridge.to_target(bridged, [(i, i + 1)]))
    assert kept == '"456789"'
