"""Cross-tokenizer PFlash: score with the drafter's tokens, keep the target's (no vLLM import).

When the drafter's vocabulary differs from the target's, the prompt goes through text: the target's
tokens are decoded, the drafter's tokenizer re-tokenizes the text with character offsets, the kept
drafter-token spans become character spans widened to word boundaries (whitespace), and each kept
character span is re-encoded with the target's tokenizer. Cutting only at whitespace keeps words,
numbers and identifiers whole, so a kept needle survives the round trip.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BridgedPrompt:
    text: str
    drafter_ids: list[int]
    offsets: list[tuple[int, int]]  # character span of each drafter token in ``text``


class TextBridge:
    def __init__(self, target_tokenizer, drafter_tokenizer):
        self.target, self.drafter = target_tokenizer, drafter_tokenizer

    def to_drafter(self, target_ids: list[int]) -> BridgedPrompt:
        text = self.target.decode(target_ids, skip_special_tokens=False)
        enc = self.drafter(text, add_special_tokens=False, return_offsets_mapping=True)
        return BridgedPrompt(text, list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]])

    def to_target(self, bridged: BridgedPrompt, spans: list[tuple[int, int]]) -> list[int]:
        """Target token ids of the kept drafter-token ``spans`` ([start, end) in drafter tokens)."""
        out: list[int] = []
        for a, b in char_spans(bridged, spans):
            out.extend(self.target.encode(bridged.text[a:b], add_special_tokens=False))
        return out


def char_spans(bridged: BridgedPrompt, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Kept token spans -> character spans widened to the surrounding whitespace, merged where they
    touch or only whitespace separates them."""
    text, offsets = bridged.text, bridged.offsets
    out: list[tuple[int, int]] = []
    for start, end in spans:
        if start >= end:
            continue
        a, b = offsets[start][0], offsets[end - 1][1]
        while a < b and text[a].isspace():  # byte-level tokens carry their leading space
            a += 1
        while a > 0 and not text[a - 1].isspace():
            a -= 1
        while b < len(text) and not text[b].isspace():
            b += 1
        if out and (a <= out[-1][1] or text[out[-1][1]:a].isspace()):
            out[-1] = (out[-1][0], max(b, out[-1][1]))
        else:
            out.append((a, b))
    return out
