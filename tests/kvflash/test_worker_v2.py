"""KVFlash's Model Runner V2 binding against V2's interfaces, with stand-in runner objects: vLLM 0.32's CPU backend
has a V2 runner (``vllm/v1/worker/cpu/model_runner.py``) but refuses it without Triton ("Model Runner V2 requires
Triton"), which the CPU machines lack. Checks: signatures of the V2 methods bound, pooled-group slot mapping from the
pagers (other groups untouched), bounded residency inside the request's own blocks, resident seq_lens for the builders,
releases and rows cut (lent blocks taken back) through finish_requests, and the drafter-scorer policy over V2's request
states."""

import inspect
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_luce.config import LuceConfig

BS, H, D, POOL = 128, 2, 32, 384


def test_v2_signatures_are_the_ones_bound():
    from vllm.v1.worker.gpu.block_table import BlockTables
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    assert str(inspect.signature(BlockTables.compute_slot_mappings)) == (
        "(self, idx_mapping: torch.Tensor, query_start_loc: torch.Tensor, positions: torch.Tensor, "
        "num_tokens_padded: int, out: torch.Tensor | None = None) -> torch.Tensor")
    assert str(inspect.signature(BlockTables.append_block_ids)) == (
        "(self, req_index: int, new_block_ids: tuple[list[int], ...], overwrite: bool) -> None")
    assert "scheduler_output" in inspect.signature(GPUModelRunner.finish_requests).parameters
    assert list(inspect.signature(GPUModelRunner.prepare_attn).parameters) == ["self", "input_batch"]
    from dataclasses import fields

    from vllm.v1.worker.gpu.input_batch import InputBatch

    assert {"req_ids", "num_reqs", "idx_mapping", "idx_mapping_np", "query_start_loc_np",
            "num_computed_tokens_np"} <= {f.name for f in fields(InputBatch)}


class FakeBlockTables:
    def __init__(self):
        self.block_sizes, self.max_num_reqs = [BS, BS], 4
        self.appended = []
        self.num_blocks = SimpleNamespace(np=np.zeros((2, 4), dtype=np.int32))

    def append_block_ids(self, req_index, new_block_ids, overwrite):
        self.appended.append((req_index, new_block_ids, overwrite))
        for group, ids in enumerate(new_block_ids):
            self.num_blocks.np[group, req_index] = (0 if overwrite else self.num_blocks.np[group, req_index]) + len(ids)

    def compute_slot_mappings(self, idx_mapping, query_start_loc, positions, num_tokens_padded, out=None):
        return torch.full((2, num_tokens_padded), 7, dtype=torch.int64)  # V2's own result: "7" everywhere


def fake_runner():
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    from vllm_luce.kvflash.spec import KVFlashSpec

    full = FullAttentionSpec(block_size=BS, num_kv_heads=H, head_size=D, dtype=torch.bfloat16)
    groups = [KVCacheGroupSpec(["sliding"], full), KVCacheGroupSpec(["pooled"], KVFlashSpec.from_full_attention(full, POOL))]
    cache = torch.zeros(16, H, BS, 2 * D, dtype=torch.bfloat16)  # CPU layout
    layer = SimpleNamespace(kv_cache=cache, impl=SimpleNamespace(forward=lambda *a, **k: None))
    builder = SimpleNamespace(build=lambda prefix, cm, *a, **k: cm)
    backend = SimpleNamespace(get_name=lambda: "CPU_ATTN")
    finished = []
    runner = SimpleNamespace(
        kv_cache_config=KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=groups),
        compilation_config=SimpleNamespace(static_forward_context={"pooled": layer}),
        block_tables=FakeBlockTables(),
        attn_groups=[[], [SimpleNamespace(backend=backend, metadata_builders=[builder])]],
        req_states=SimpleNamespace(index_to_req_id={2: "r"}, req_id_to_index={"r": 2},
                                   prompt_len=SimpleNamespace(np=np.array([0, 0, 4000, 0]))),
        finish_requests=lambda out: finished.append(out),
        get_model=lambda: torch.nn.Module(),  # no rotary embedding: the salient policy scores every dim
        prepare_attn=lambda input_batch: runner.block_tables.compute_slot_mappings(
            input_batch.idx_mapping, input_batch.query_start_loc, input_batch.positions, input_batch.num_tokens),
        vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1),
                                    model_config=SimpleNamespace(served_model_name="tiny", max_model_len=2048)),
    )
    return runner, finished


@dataclass
class CM:
    """The CommonAttentionMetadata fields the pooled builder reads."""
    num_reqs: int
    seq_lens: torch.Tensor
    max_seq_len: int
    max_query_len: int
    block_table_tensor: torch.Tensor | None = None
    seq_lens_cpu_upper_bound: object = None


def step(runner, start, n):
    return runner.block_tables.compute_slot_mappings(
        torch.tensor([2]), torch.tensor([0, n], dtype=torch.int32), torch.arange(start, start + n), n)


def test_v2_binding_maps_pooled_slots_inside_the_request_blocks_and_releases():
    from vllm_luce.kvflash.worker_v2 import bind_v2

    runner, finished = fake_runner()
    luce = LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": POOL, "policy": "lru"}}}, {})
    runtime = bind_v2(runner, luce)
    runner.block_tables.append_block_ids(2, ([1], [9, 4, 12]), overwrite=False)  # pooled: 3 blocks of 128
    first = step(runner, 0, 200)
    assert torch.equal(first[0], torch.full((200,), 7))  # the other group keeps V2's slots
    expected = [9 * BS + p if p < BS else 4 * BS + p - BS for p in range(200)]
    assert first[1].tolist() == expected
    for start in range(200, 1000, 100):  # far past the pool: residency stays bounded
        slots = step(runner, start, 100)[1]
        assert set((slots // BS).tolist()) <= {9, 4, 12}
    pager = runtime.pagers["r"]
    assert len(pager.resident) * 64 <= POOL and pager.host
    assert int(runtime.resident_lens[0]) == pager.resident_tokens() <= POOL
    built = runner.attn_groups[1][0].metadata_builders[0].build(0, CM(1, torch.tensor([1000]), 1000, 100))
    assert built.seq_lens.tolist() == [pager.resident_tokens()] and built.max_seq_len == pager.resident_tokens()
    runner.finish_requests(SimpleNamespace(finished_req_ids={"r"}, preempted_req_ids=None))
    assert finished and not runtime.pagers and runtime.released.page_outs > 0


class DeviceOnly(torch.Tensor):
    """A device tensor as the host sees it: reading it back (``.cpu()``) would wait for the step in flight."""

    def cpu(self, *args, **kwargs):
        raise AssertionError("read back from the device")


def test_v2_steps_read_the_input_batchs_host_mirrors_not_the_device():
    """A step's slot mapping comes from the InputBatch's host mirrors (request ids, query starts, computed tokens):
    reading V2's device tensors back made every step wait for the one before it on the GPU."""
    from vllm_luce.kvflash.worker_v2 import bind_v2

    runner, _ = fake_runner()
    runtime = bind_v2(runner, LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": POOL, "policy": "lru"}}}, {}))
    runner.block_tables.append_block_ids(2, ([1], [9, 4, 12]), overwrite=False)
    by_device = {}
    for start, n in ((0, 200), (200, 100), (300, 1)):
        batch = SimpleNamespace(
            req_ids=["r"], num_reqs=1, idx_mapping=torch.tensor([2]).as_subclass(DeviceOnly), idx_mapping_np=np.array([2]),
            query_start_loc=torch.tensor([0, n], dtype=torch.int32).as_subclass(DeviceOnly),
            query_start_loc_np=np.array([0, n], dtype=np.int32), num_computed_tokens_np=np.array([start], dtype=np.int32),
            positions=torch.arange(start, start + n).as_subclass(DeviceOnly), num_tokens=n)
        slots = runner.prepare_attn(batch)[1]
        by_device[start] = slots.as_subclass(torch.Tensor).tolist()
    assert by_device[0] == [9 * BS + p if p < BS else 4 * BS + p - BS for p in range(200)]
    assert runtime.pagers["r"].num_tokens == 301 and set(s // BS for s in by_device[300]) <= {9, 4, 12}


def test_v2_binding_with_sfi_keeps_vllms_slots_and_starts_fast_rows_at_the_selection():
    from vllm_luce.kvflash.worker_v2 import bind_v2

    runner, _ = fake_runner()
    runner.req_states.prompt_len.np[2] = 900
    luce = LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": POOL, "selection": "sfi"}}}, {})
    runtime = bind_v2(runner, luce)
    row = [9, 4, 12, 3, 5, 14, 6, 8]  # 1024 tokens: everything resident
    runner.block_tables.append_block_ids(2, ([1], row), overwrite=False)
    prefill = step(runner, 0, 900)[1]
    assert prefill.tolist() == [row[p // BS] * BS + p % BS for p in range(900)]  # vLLM's own slot mapping
    decode = step(runner, 900, 1)[1]
    assert decode.tolist() == [row[900 // BS] * BS + 900 % BS]
    skip = int(runtime.skip_blocks[0])
    assert skip > 0 and runtime.pagers["r"].stats.sparse_steps == 1

    table = torch.tensor([row + [0, 0]], dtype=torch.int32)
    built = runner.attn_groups[1][0].metadata_builders[0].build(0, CM(1, torch.tensor([901]), 901, 1, block_table_tensor=table))
    assert built.seq_lens.tolist() == [901 - skip * BS]
    assert built.block_table_tensor[0, : len(row) - skip].tolist() == row[skip:]
    assert table[0].tolist() == row + [0, 0]  # vLLM's table itself is untouched


def test_what_attention_and_query_capture_touch_keeps_its_address_from_step_to_step():
    """CUDA graphs replay captured addresses with no Python: the pooled seq_lens, the rows gathered and the query
    buffers must be the same tensors every step, holding that step's values."""
    from vllm_luce.kvflash.worker_v2 import bind_v2

    runner, _ = fake_runner()
    luce = LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": POOL, "policy": "qk"}}}, {})
    runtime = bind_v2(runner, luce)
    runner.block_tables.append_block_ids(2, ([1], [9, 4, 12]), overwrite=False)
    layer = runner.compilation_config.static_forward_context["pooled"]
    builder = runner.attn_groups[1][0].metadata_builders[0]
    seen, kept = [], []  # kept: each step's metadata stays alive, so a tensor made per step gets a new address
    for start, n in ((0, 252), (252, 1), (253, 1)):  # the tokens before a decision (256)
        step(runner, start, n)
        built = builder.build(0, CM(1, torch.tensor([start + n, 7]), start + n, n))
        assert built.seq_lens.tolist() == [runtime.pagers["r"].resident_tokens(), 7]
        kept.append(built)
        query = torch.randn(n, 4, D)
        layer.impl.forward(layer, query, None, None, None, SimpleNamespace(num_actual_tokens=n), None)
        seen.append((built.seq_lens.data_ptr(), runtime._rows.data_ptr(), runtime._queries[0].data_ptr(), query[-1]))
    assert len({s[:3] for s in seen}) == 1, seen
    step(runner, 254, 1)  # the next step hands the last one's queries to the pager
    assert torch.equal(runtime.pagers["r"].query_tokens[-1, 0], seen[-1][3].float())  # the newest in the window


class CapturingBuilder:
    """vLLM's default ``build_for_cudagraph_capture``: ``self.build`` on the builder itself."""

    def build(self, common_prefix_len, cm, *args, **kwargs):
        return cm

    def build_for_cudagraph_capture(self, cm):
        return self.build(0, cm)


def test_a_captured_graph_reads_the_pooled_lengths_that_later_steps_write():
    """A graph captured through vLLM's capture build must read the buffer each step's build fills with the
    resident lengths, never vLLM's own seq_lens (the whole context: attention over blocks the pool lacks)."""
    from vllm_luce.kvflash.worker_v2 import bind_v2

    runner, _ = fake_runner()
    runner.attn_groups[1][0].metadata_builders = [CapturingBuilder()]
    luce = LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": POOL}}}, {})
    runtime = bind_v2(runner, luce)
    builder = runner.attn_groups[1][0].metadata_builders[0]
    assert not builder.supports_update_block_table
    vllms = torch.tensor([4096, 4096])  # vLLM captures at long lengths
    captured = builder.build_for_cudagraph_capture(CM(2, vllms, 4096, 1))
    assert captured.seq_lens.data_ptr() != vllms.data_ptr()
    assert captured.seq_lens.tolist() == [POOL, POOL] and captured.max_seq_len == POOL
    runner.block_tables.append_block_ids(2, ([1], [9, 4, 12]), overwrite=False)
    step(runner, 0, 300)
    built = builder.build(0, CM(1, torch.tensor([300, 0]), 300, 300))
    assert built.seq_lens.data_ptr() == captured.seq_lens.data_ptr()
    assert captured.seq_lens.tolist() == [runtime.pagers["r"].resident_tokens(), 0]


def test_the_warm_up_summarises_and_scores_a_chunk_as_a_reselection_does(monkeypatch):
    """At startup (on a GPU) the policy's summary and scoring kernels run once on the null block, with queries of a
    reselection's shape (this rank's query heads times the query window), and without the tensor-parallel reduction."""
    from vllm_luce.kvflash import policies
    from vllm_luce.kvflash.worker_v2 import bind_v2

    runner, _ = fake_runner()
    runtime = bind_v2(runner, LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": POOL}}}, {}))
    runtime.policy.reduce_max = lambda t: pytest.fail("the warm-up must not all-reduce")
    seen = []
    scores = policies.salient_layer_scores
    monkeypatch.setattr(policies, "salient_layer_scores",
                        lambda q, k, rope: seen.append((q.shape, k.shape)) or scores(q, k, rope))
    store = runtime._new_store()
    store.row = np.zeros(1, dtype=np.int64)
    runtime.warm_up_policy(store, q_heads=4)
    assert seen == [((1, 4 * 8, D), (1, 1, H, 2, D // 2 + 2))]  # one chunk's two int4 keys of every dim


def test_query_capture_clamps_the_rows_once_a_forward_and_keeps_every_layer_in_bounds(monkeypatch):
    """Each pooled layer gathers its last-token queries by the step's rows; the rows are clamped to the forward's
    tokens once (in the first layer), not once a layer: inside a decode graph each clamp was a kernel of its own."""
    from vllm_luce.kvflash.worker_v2 import bind_v2

    runner, _ = fake_runner()
    runtime = bind_v2(runner, LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": POOL}}}, {}))
    clamps, clamp = [], torch.clamp
    monkeypatch.setattr(torch, "clamp", lambda *a, **k: clamps.append(1) or clamp(*a, **k))
    query = torch.randn(3, 4, D)
    for layer in (2, 0, 1):  # the first forward fixes the order
        runtime.observe_queries(layer, query)
    runtime.step_last_rows = np.array([7])  # a row past this forward's 3 tokens (a dummy run's smaller batch)
    runtime._load_rows()
    clamps.clear()
    for layer in (2, 0, 1):
        runtime.observe_queries(layer, query)
    assert len(clamps) == 1
    assert all(torch.equal(runtime._queries[layer][0], query[2]) for layer in (0, 1, 2))


def test_a_row_the_scheduler_cuts_moves_its_cold_chunks_out_bit_exact_before_the_blocks_go():
    from vllm_luce.kvflash.worker_v2 import bind_v2

    runner, _ = fake_runner()
    luce = LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": POOL, "policy": "lru"}}}, {})
    runtime = bind_v2(runner, luce)
    runner.block_tables.append_block_ids(2, ([1], [9, 4, 12, 5, 6, 7]), overwrite=False)  # pool, then 3 lent
    for start in range(0, 1000, 100):
        step(runner, start, 100)
    pager = runtime.pagers["r"]
    assert len(pager.cold) == 6 and pager.host  # the 3 lent blocks hold 6 cold chunks
    beyond = {c: pager.store.read(p).clone() for c, p in pager.cold.items() if p >= 8}
    assert len(beyond) == 4  # in blocks 6 and 7
    runner.finish_requests(SimpleNamespace(finished_req_ids=set(), preempted_req_ids=None,
                                           luce_cold_rows={"r": 4}))
    assert runner.block_tables.num_blocks.np[1, 2] == 4 and pager.stats.demotions == 4
    for chunk, data in beyond.items():
        assert torch.equal(pager.host[chunk], data)
    runtime.caches[0][6:8].fill_(float("nan"))  # blocks 6 and 7 belong to another request now
    for start in range(1000, 1400, 100):
        slots = step(runner, start, 100)[1]
        assert set((slots // BS).tolist()) <= {9, 4, 12, 5}
    assert all(p < 8 for p in pager.cold.values()) and pager.stats.lost == 0
    for position in [*range(len(pager.resident)), *pager.cold.values()]:  # nothing of theirs read back
        assert not pager.store.read(position).isnan().any()


def test_v2_binding_with_policy_scorer_scores_the_chunks_with_the_drafter_over_v2s_request_states():
    """policy 'scorer' on Model Runner V2: the runtime is assembled as on V1, and the seam's binding
    (``scorer_policy.bind``, after KVFlash's and PFlash's) attaches PFlash's drafter, whose token ids come from V2's
    request states (all_token_ids up to total_len, prompt_len); the chunk it scores highest stays resident while the
    prompt pages out. The drafter is a stand-in that scores one chunk's tokens above the rest."""
    from vllm_luce import scorer_policy
    from vllm_luce.kvflash.worker_v2 import bind_v2

    tokens = 1000 + torch.arange(4000, dtype=torch.int32)
    scored = []

    def token_scores(ids):
        scored.append(list(ids))
        return torch.tensor([1.0 if 192 <= i < 256 else 0.0 for i in range(len(ids))])  # chunk 3

    runner, finished = fake_runner()
    all_token_ids = torch.zeros(4, 4096, dtype=torch.int32)
    all_token_ids[2, :4000] = tokens
    runner.req_states.all_token_ids = SimpleNamespace(gpu=all_token_ids)
    runner.req_states.total_len = SimpleNamespace(gpu=torch.tensor([0, 0, 4000, 0], dtype=torch.int32))
    luce = LuceConfig.from_sources({"luce": {"kvflash": {"pool_tokens": POOL, "policy": "scorer"},
                                             "pflash": {"drafter": "/a/drafter"}}}, {})
    runtime = bind_v2(runner, luce)
    assert runtime.policy.name == "scorer"
    runner.luce_pflash = SimpleNamespace(scorer=SimpleNamespace(token_scores=token_scores))  # PFlash's binding
    scorer_policy.bind(runner, luce)
    runner.block_tables.append_block_ids(2, ([1], [9, 4, 12]), overwrite=False)
    for start in range(0, 1000, 100):
        step(runner, start, 100)
    pager = runtime.pagers["r"]
    assert scored and scored[0] == tokens.tolist()  # the whole prompt, read from V2's states
    assert pager.stats.page_outs > 0 and 3 in pager.resident and 2 not in pager.resident, pager.resident
    runner.finish_requests(SimpleNamespace(finished_req_ids={"r"}, preempted_req_ids=None))
    assert finished and not runtime.pagers
