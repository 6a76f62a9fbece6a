"""The pooled group's metadata builder (``kvflash/worker.py``): attention reads each request's resident tokens, and
a CUDA graph's padding rows keep vLLM's lengths."""

from dataclasses import dataclass
from types import MethodType, SimpleNamespace

import torch

from vllm_luce.kvflash.runtime import KVFlashRuntime
from vllm_luce.kvflash.worker import PooledBuilder


@dataclass
class Metadata:  # the fields of vLLM's CommonAttentionMetadata the builder reads and replaces
    num_reqs: int
    seq_lens: torch.Tensor
    max_seq_len: int
    max_query_len: int
    seq_lens_cpu_upper_bound: torch.Tensor | None
    block_table_tensor: torch.Tensor


class Inner:  # vLLM's builder: what it is given is what attention reads
    def build(self, common_prefix_len, cm, *args, **kwargs):
        return cm


def runtime(resident: list[int], step_requests: int, max_num_reqs: int = 8):
    rt = SimpleNamespace(resident_lens=torch.zeros(max_num_reqs, dtype=torch.int32), sfi=False,
                         skip_blocks=torch.zeros(max_num_reqs, dtype=torch.int64), _buffers={},
                         max_num_reqs=max_num_reqs, config=SimpleNamespace(pool_tokens=64),
                         step_req_ids=[f"r{i}" for i in range(step_requests)])
    rt.resident_lens[: len(resident)] = torch.tensor(resident, dtype=torch.int32)
    rt.graph_buffer = MethodType(KVFlashRuntime.graph_buffer, rt)
    return rt


def metadata(seq_lens: list[int], query_len: int = 16) -> Metadata:
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return Metadata(num_reqs=len(seq_lens), seq_lens=lens, max_seq_len=int(lens.max()), max_query_len=query_len,
                    seq_lens_cpu_upper_bound=lens.clone(), block_table_tensor=torch.zeros(len(seq_lens), 4))


def test_requests_read_their_resident_tokens():
    built = PooledBuilder(Inner(), runtime([64, 30, 17], step_requests=3)).build(5, metadata([500, 30, 17]))
    assert built.seq_lens.tolist() == [64, 30, 17] and built.max_seq_len == 64
    assert built.seq_lens_cpu_upper_bound.tolist() == [64 + 16, 30, 17]


def test_graph_padding_rows_keep_vllms_lengths():
    """A step of 2 requests padded to a graph of 4 rows, after a step of 4: the padding rows read nothing (vLLM's 0),
    not the lengths an earlier step's requests left in the pagers' rows."""
    rt = runtime([64, 30, 60, 50], step_requests=2)  # rows 2 and 3: the earlier step's
    built = PooledBuilder(Inner(), rt).build(0, metadata([100, 30, 0, 0]))
    assert built.seq_lens.tolist() == [64, 30, 0, 0]
    assert built.max_seq_len == 64
    assert built.seq_lens_cpu_upper_bound.tolist() == [64 + 16, 30, 0, 0]
