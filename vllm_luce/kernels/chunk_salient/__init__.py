"""chunk_salient: KVFlash's salient-key policy on the GPU. Per chunk and KV head the key farthest from the chunk's
mean key (fp8 e5m2) read straight from every layer's KV cache, and the chunks' scores against the current query
rows (Triton + reference)."""

from vllm_luce.kernels.chunk_salient.chunk_salient import salient_keys, salient_scores
from vllm_luce.kernels.chunk_salient.naive import salient_from_keys, salient_keys_naive, salient_scores_naive

__all__ = ["salient_from_keys", "salient_keys", "salient_keys_naive", "salient_scores", "salient_scores_naive"]
