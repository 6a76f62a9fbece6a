"""chunk_salient: KVFlash's salient-key policy on the GPU. Per chunk, layer and KV head two keys (the one farthest
from the chunk's mean key, then the one farthest from both), their scored dims packed in int4 with an fp16 scale,
read straight from every layer's KV cache; and the chunks' scores against the current query rows (Triton +
reference)."""

from vllm_luce.kernels.chunk_salient.chunk_salient import salient_keys, salient_scores
from vllm_luce.kernels.chunk_salient.naive import (row_bytes, salient_decode, salient_from_keys, salient_keys_naive,
                                                   salient_scores_naive)

__all__ = ["row_bytes", "salient_decode", "salient_from_keys", "salient_keys", "salient_keys_naive", "salient_scores",
           "salient_scores_naive"]
