"""The per-layer plan of a target model (no vLLM import): which decoder layers are full attention,
sliding-window attention or linear attention (Gated DeltaNet), with their shapes.

This is what the features attach to: KVFlash pools the full-attention layers, DFlash checks its
target layer ids against `num_layers`, PFlash and KVFlash read per-layer attention shapes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

FULL, SLIDING, LINEAR = "full_attention", "sliding_attention", "linear_attention"


@dataclass(frozen=True)
class LayerInfo:
    index: int
    kind: str
    module_name: str
    num_heads: int | None = None  # per tensor-parallel rank, as vLLM's Attention holds them
    num_kv_heads: int | None = None
    head_size: int | None = None
    sliding_window: int | None = None
    kv_shared_from: str | None = None  # Gemma-style cross-layer KV sharing: this layer owns no KV


@dataclass(frozen=True)
class LayerPlan:
    layers: tuple[LayerInfo, ...]

    def __post_init__(self) -> None:
        indices = [layer.index for layer in self.layers]
        if indices != sorted(set(indices)):
            raise ValueError(f"layer plan needs one entry per decoder layer, in order; got indices {indices}")
        for layer in self.layers:
            if layer.kind not in (FULL, SLIDING, LINEAR):
                raise ValueError(f"layer {layer.index}: unknown kind {layer.kind!r}")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def of_kind(self, kind: str) -> tuple[LayerInfo, ...]:
        return tuple(layer for layer in self.layers if layer.kind == kind)

    @property
    def full_attention(self) -> tuple[LayerInfo, ...]:
        """Full-attention layers that own their KV (the ones whose KV grows with context)."""
        return tuple(layer for layer in self.of_kind(FULL) if layer.kv_shared_from is None)

    def summary(self) -> str:
        counts = Counter(layer.kind for layer in self.layers)
        kinds = ", ".join(f"{counts[k]} {k}" for k in (FULL, SLIDING, LINEAR) if counts[k])
        return f"{self.num_layers} layers: {kinds}"

    def check_capture_layers(self, layer_ids: list[int] | tuple[int, ...], source: str) -> None:
        """DFlash `target_layer_ids` mean "output of decoder layer i": each must name a real layer."""
        bad = [i for i in layer_ids if not isinstance(i, int) or not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"{source}: target layer ids {list(layer_ids)} include {bad}, but the target "
                             f"has {self.num_layers} decoder layers (valid ids 0..{self.num_layers - 1})")


def layer_info_from_attention(index: int, name: str, attn) -> LayerInfo:
    """Read a vLLM `Attention` module's shape (duck-typed, so the core stays import-free)."""
    window = getattr(attn, "sliding_window", None)
    return LayerInfo(
        index=index,
        kind=SLIDING if window else FULL,
        module_name=name,
        num_heads=attn.num_heads,
        num_kv_heads=attn.num_kv_heads,
        head_size=attn.head_size,
        sliding_window=window or None,
        kv_shared_from=getattr(attn, "kv_sharing_target_layer_name", None),
    )
