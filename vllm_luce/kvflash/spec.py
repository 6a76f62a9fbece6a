"""KVFlash on vLLM's scheduler side: a KV cache spec and manager, registered through
``KVCacheSpecRegistry`` (no patch).

``KVFlashSpec`` is a full-attention spec with a per-request cap of ``pool_tokens``: the manager
allocates the blocks a request must have as it grows, up to ``ceil(pool_tokens / block_size)`` blocks
(``pool_tokens`` 0: no cap, the SFI selection mode, which keeps all KV resident). The scheduler's startup
check (``max_memory_usage_bytes``) and its admission therefore see the pool, not the context, so prompts far
beyond the KV budget are admitted. Beyond the pool the manager lends a request free blocks for its cold chunks
while the cache has room, and reserves host memory for the rest before the step that pages it out; a request that
fits neither is not allocated, so vLLM holds it back or preempts, as for blocks (``admission.py``, wired by the
scheduler); lent blocks come back when requests wait for blocks (``luce_take_back``). The block table's rows have
room for a whole context (``cold``). Where tokens go inside those blocks is the worker's business (``worker.py``: a
compacted pool, then cold chunks, see ``pager.py``).
Prefix caching is off for these layers: a block's content depends on paging, not on the prefix.
Importing this module registers the spec.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar

from vllm.utils.math_utils import cdiv
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
from vllm.v1.kv_cache_interface import FullAttentionSpec

MAX_CHUNK = 1024  # the largest kvflash.chunk_tokens: a row of max_len + MAX_CHUNK tokens holds every chunk of a context


class KVFlashMergeError(AssertionError, ValueError):
    """Specs that cannot share a KV cache group. vLLM's callers of ``merge`` differ in what they catch (0.26-0.33):
    ``is_kv_cache_spec_uniform`` only AssertionError, the grouping of same-type layers (AssertionError, ValueError);
    this is both, so each treats the pooled layers as a group of their own whatever layer comes first."""


@dataclass(frozen=True, kw_only=True)
class KVFlashSpec(FullAttentionSpec):
    pool_tokens: int = 0  # 0: every block resident (SFI)
    cold_rows: bool = False  # rows with room for cold chunks beyond the pool (a whole context)

    @classmethod
    def from_full_attention(cls, spec: FullAttentionSpec, pool_tokens: int, cold_rows: bool = False) -> "KVFlashSpec":
        if type(spec) is not FullAttentionSpec:
            raise TypeError(f"KVFlash pools full-attention layers; got a {type(spec).__name__}")
        return cls(**{f.name: getattr(spec, f.name) for f in fields(spec)}, pool_tokens=pool_tokens,
                   cold_rows=cold_rows)

    @property
    def pool_blocks(self) -> int | None:
        return cdiv(self.pool_tokens, self.block_size) if self.pool_tokens else None

    def max_num_blocks_per_req(self, vllm_config, max_len: int) -> int:
        """The block table's row: the pool, or with cold rows the pool and a cold position per chunk beyond it (whole
        chunks, ``admission.AdmissionConfig.cold_chunks``)."""
        blocks = cdiv(max_len, self.block_size)
        if self.pool_blocks is None:
            return blocks
        if self.cold_rows:
            return max(self.pool_blocks, cdiv(max_len + MAX_CHUNK, self.block_size))
        return min(self.pool_blocks, blocks)

    def max_memory_usage_bytes(self, vllm_config) -> int:
        """What a request must have: its pool (blocks lent for cold chunks are free blocks, never required)."""
        blocks = cdiv(vllm_config.model_config.max_model_len, self.block_size)
        return (blocks if self.pool_blocks is None else min(self.pool_blocks, blocks)) * self.page_size_bytes

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
        if len({spec.cold_rows for spec in specs}) != 1:
            raise KVFlashMergeError("KVFlash layers of one KV cache group differ in cold_rows")
        return replace(super().merge(specs), pool_tokens=pools.pop(), cold_rows=specs[0].cold_rows)


class KVFlashManager(FullAttentionManager):
    """FullAttentionManager with the blocks a request must have capped at the pool, and (with ``luce_admission``, set
    by vllm-luce's scheduler) free blocks lent for cold chunks and host memory reserved; no prefix caching."""

    supports_fine_grained_hash_lookup: ClassVar[bool] = False
    luce_admission = None  # admission.HostAdmission; None (SFI, no vllm-luce scheduler): the pool cap only

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.luce_lent: dict[str, int] = {}  # blocks lent for cold chunks at a request's latest count, to allocate

    def _cap(self, num_tokens: int) -> int:
        pool_blocks = self.kv_cache_spec.pool_blocks
        return num_tokens if pool_blocks is None else min(num_tokens, pool_blocks * self.block_size)

    # The overrides pass vLLM's trailing parameters through untouched: they differ between the supported
    # series (0.26 lacks prefill_end, record_for_zeroing and replay_boundaries).
    def get_num_blocks_to_allocate(self, request_id, num_tokens, new_computed_blocks, total_computed_tokens,
                                   num_local_computed_tokens, num_tokens_main_model, *args, **kwargs) -> int:
        blocks = super().get_num_blocks_to_allocate(
            request_id, self._cap(num_tokens), new_computed_blocks, total_computed_tokens, num_local_computed_tokens,
            self._cap(num_tokens_main_model), *args, **kwargs)
        admission = self.luce_admission
        if admission is None or kwargs.get("apply_admission_cap"):
            # vLLM's check that a whole new sequence fits (scheduler_reserve_full_isl) reserves no host memory: the
            # steps that page out wait for it (a refusal here would hold every request behind it in the queue)
            return blocks
        lent, nbytes = self._tiers(request_id, admission.tokens_for(request_id, num_tokens), blocks)
        if not admission.hold(request_id, nbytes):
            return self.block_pool.num_gpu_blocks + 1  # more than exist: vLLM holds the request back or preempts
        self.luce_lent[request_id] = lent
        return blocks

    def luce_step_host_bytes(self, request_id: str, num_tokens: int) -> int:
        """The host bytes a running request's step to ``num_tokens`` tokens reserves (its allocation's, found before
        it: the scheduler waits for host memory without taking it for too few blocks)."""
        held = len(self.req_to_blocks.get(request_id, ()))
        return self._tiers(request_id, num_tokens, max(0, cdiv(self._cap(num_tokens), self.block_size) - held))[1]

    def _tiers(self, request_id: str, num_tokens: int, blocks: int) -> tuple[int, int]:
        """(free blocks lent for cold chunks, host bytes) of a request growing to ``num_tokens`` with ``blocks`` new
        blocks of its pool."""
        cfg, held = self.luce_admission.config, len(self.req_to_blocks.get(request_id, ())) + blocks
        spare = self.block_pool.get_num_free_blocks() - blocks - cfg.reserve_blocks
        lent = max(0, min(cfg.cold_blocks_wanted(num_tokens, held), spare))
        return lent, cfg.host_bytes(num_tokens, held + lent)

    def allocate_new_blocks(self, request_id, num_tokens, num_tokens_main_model):
        admission = self.luce_admission
        if admission is None:
            return super().allocate_new_blocks(request_id, self._cap(num_tokens), self._cap(num_tokens_main_model))
        # The blocks lent fit: ``reserve_blocks`` covers what the request's other groups take after this one.
        held = max(len(self.req_to_blocks[request_id]), cdiv(self._cap(num_tokens), self.block_size))
        target = held + min(self.luce_lent.pop(request_id, 0), self.block_pool.get_num_free_blocks())
        new = super().allocate_new_blocks(request_id, target * self.block_size, self._cap(num_tokens_main_model))
        admission.commit(request_id, admission.config.host_bytes(admission.tokens_for(request_id, num_tokens),
                                                                 len(self.req_to_blocks[request_id])))
        return new

    def luce_lent_blocks(self, request_id: str) -> int:
        """Blocks of the request's row beyond its pool: lent for cold chunks."""
        pool = self.kv_cache_spec.pool_blocks
        return 0 if pool is None else max(0, len(self.req_to_blocks.get(request_id, ())) - pool)

    def luce_take_back(self, request_id: str, count: int) -> int:
        """Free the last ``count`` blocks lent to the request (its workers move their cold chunks out first, told by
        the step's output); returns the row's length after, in blocks."""
        row = self.req_to_blocks[request_id]
        count = min(count, self.luce_lent_blocks(request_id))
        taken = row[len(row) - count:]
        del row[len(row) - count:]
        self.block_pool.free_blocks(reversed(taken))
        return len(row)

    def free(self, request_id: str) -> None:
        super().free(request_id)
        self.luce_lent.pop(request_id, None)
        if self.luce_admission is not None:
            self.luce_admission.release(request_id)

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
