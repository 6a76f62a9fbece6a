"""KVFlash on vLLM's scheduler side: a KV cache spec and manager, registered through
``KVCacheSpecRegistry`` (no patch).

``KVFlashSpec`` is a full-attention spec with a per-request cap of ``pool_tokens``: the manager
allocates blocks as a request grows, up to ``ceil(pool_tokens / block_size)`` blocks, and never
more (``pool_tokens`` 0: no cap, the SFI selection mode, which keeps all KV resident). The
scheduler's startup check (``max_memory_usage_bytes``) and its admission therefore see the pool, not
the context, so prompts far beyond the KV budget are admitted. Where tokens go inside
those blocks is the worker's business (``worker.py``: a compacted pool, see ``pager.py``).
Prefix caching is off for these layers: a block's content depends on paging, not on the prefix.
Importing this module registers the spec.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar

from vllm.utils.math_utils import cdiv
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
from vllm.v1.kv_cache_interface import FullAttentionSpec


class KVFlashMergeError(AssertionError, ValueError):
    """Specs that cannot share a KV cache group. vLLM's callers of ``merge`` differ in what they catch (0.26-0.33):
    ``is_kv_cache_spec_uniform`` only AssertionError, the grouping of same-type layers (AssertionError, ValueError);
    this is both, so each treats the pooled layers as a group of their own whatever layer comes first."""


@dataclass(frozen=True, kw_only=True)
class KVFlashSpec(FullAttentionSpec):
    pool_tokens: int = 0  # 0: every block resident (SFI)

    @classmethod
    def from_full_attention(cls, spec: FullAttentionSpec, pool_tokens: int) -> "KVFlashSpec":
        if type(spec) is not FullAttentionSpec:
            raise TypeError(f"KVFlash pools full-attention layers; got a {type(spec).__name__}")
        return cls(**{f.name: getattr(spec, f.name) for f in fields(spec)}, pool_tokens=pool_tokens)

    @property
    def pool_blocks(self) -> int | None:
        return cdiv(self.pool_tokens, self.block_size) if self.pool_tokens else None

    def max_num_blocks_per_req(self, vllm_config, max_len: int) -> int:
        blocks = cdiv(max_len, self.block_size)
        return blocks if self.pool_blocks is None else min(self.pool_blocks, blocks)

    def max_memory_usage_bytes(self, vllm_config) -> int:
        return self.max_num_blocks_per_req(vllm_config, vllm_config.model_config.max_model_len) \
            * self.page_size_bytes

    @property
    def prefix_cacheable(self) -> bool:
        return False

    @classmethod
    def merge(cls, specs: list["KVFlashSpec"]) -> "KVFlashSpec":
        # Pooled layers never share a group with unpooled ones (sliding-window layers, a DFlash drafter's full
        # attention): vLLM tries merges and takes a raise as "not one group" (KVFlashMergeError).
        if not all(isinstance(spec, KVFlashSpec) for spec in specs):
            raise KVFlashMergeError("KVFlash layers are grouped only with KVFlash layers")
        pools = {spec.pool_tokens for spec in specs}
        if len(pools) != 1:
            raise KVFlashMergeError(f"KVFlash layers of one KV cache group have different pools: {sorted(pools)}")
        return replace(super().merge(specs), pool_tokens=pools.pop())


class KVFlashManager(FullAttentionManager):
    """FullAttentionManager with the request's block count capped at the pool; no prefix caching."""

    supports_fine_grained_hash_lookup: ClassVar[bool] = False

    def _cap(self, num_tokens: int) -> int:
        pool_blocks = self.kv_cache_spec.pool_blocks
        return num_tokens if pool_blocks is None else min(num_tokens, pool_blocks * self.block_size)

    # The overrides pass vLLM's trailing parameters through untouched: they differ between the supported
    # series (0.26 lacks prefill_end, record_for_zeroing and replay_boundaries).
    def get_num_blocks_to_allocate(self, request_id, num_tokens, new_computed_blocks, total_computed_tokens,
                                   num_local_computed_tokens, num_tokens_main_model, *args, **kwargs) -> int:
        return super().get_num_blocks_to_allocate(
            request_id, self._cap(num_tokens), new_computed_blocks, total_computed_tokens, num_local_computed_tokens,
            self._cap(num_tokens_main_model), *args, **kwargs)

    def allocate_new_blocks(self, request_id, num_tokens, num_tokens_main_model):
        return super().allocate_new_blocks(request_id, self._cap(num_tokens), self._cap(num_tokens_main_model))

    def allocate_external_computed_blocks(self, request_id, num_local_computed_tokens,
                                          num_external_computed_tokens, *args, **kwargs) -> None:
        if num_external_computed_tokens:
            raise NotImplementedError("KVFlash does not take KV from a KV connector")

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, *args, **kwargs):
        return tuple([] for _ in kv_cache_group_ids), 0

    def cache_blocks(self, request, num_tokens, *args, **kwargs) -> None:
        return

    def remove_skipped_blocks(self, request_id, processed_computed_tokens, *args, **kwargs) -> None:
        return

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0


def _register() -> None:
    """vLLM fills its built-in registrations only while the registry is empty, so they are made first;
    then KVFlashSpec joins as its own group type (never merged with plain full attention)."""
    from vllm_luce import hooks

    hooks.register("vllm.v1.kv_cache_spec_registry:KVCacheSpecRegistry._ensure_registered")
    hooks.register("vllm.v1.kv_cache_spec_registry:KVCacheSpecRegistry.register", KVFlashSpec, KVFlashManager,
                   uniform_type_base_spec=KVFlashSpec)


# At import: any process holding a KVFlashSpec (the model's, or the scheduler's after unpickling the
# workers' specs) has imported this module, and processes without KVFlash never pay for it.
_register()
