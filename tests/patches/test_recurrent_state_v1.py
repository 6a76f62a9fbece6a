"""The V1 runner patch: after _prepare_inputs, rows vLLM would read at slot 0 after their request's verify step (back
after a step away; without drafts) get their Gated DeltaNet state moved to slot 0 and a kept count of 1, from the
counts kept by slot-0 block after each step (a runner stand-in with vLLM's own MambaSpec)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches.recurrent_state_v1 import COUNTS, TARGET, Realigner, _make_counts, _make_prepare

K, WIDTH = 3, 4


class GDNLayer:
    conv_kernel_size = WIDTH

    def __init__(self, blocks: int):  # conv state [blocks, state_len, dim], or [blocks, dim, state_len] (DS)
        conv = torch.arange(blocks * 2 * (WIDTH - 1 + K), dtype=torch.float32).view(blocks, -1, 2)
        self.kv_cache = (conv.transpose(1, 2).contiguous() if dim_first() else conv,
                         torch.arange(blocks, dtype=torch.float32).view(blocks, 1).repeat(1, 4).clone())


def dim_first() -> bool:
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    return is_conv_state_dim_first()


def window(conv_block: torch.Tensor, start: int) -> torch.Tensor:
    return conv_block[:, start:start + WIDTH - 1] if dim_first() else conv_block[start:start + WIDTH - 1]


def hybrid_runner(blocks: int, *, speculative=True, hybrid=True, mode="none", **fields) -> SimpleNamespace:
    """What a runner stand-in of either model runner shares: its configuration, a full-attention group, then a Gated
    DeltaNet group of two layers with ``blocks`` state blocks each (vLLM's own specs), and ``fields``."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    mamba = MambaSpec(block_size=16, shapes=((2, WIDTH - 1 + K), (4,)), dtypes=(torch.float32, torch.float32))
    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32)
    layers = {"linear.0": GDNLayer(blocks), "linear.1": GDNLayer(blocks), "full.0": SimpleNamespace(kv_cache=[])}
    return SimpleNamespace(
        speculative_config=object() if speculative else None, model_config=SimpleNamespace(is_hybrid=hybrid),
        cache_config=SimpleNamespace(mamba_cache_mode=mode),
        compilation_config=SimpleNamespace(static_forward_context=layers),
        kv_cache_config=SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=full, layer_names=["full.0"]),
                                                         SimpleNamespace(kv_cache_spec=mamba,
                                                                         layer_names=["linear.0", "linear.1"])]),
        layers=layers, **fields)


def runner(req_ids, accepted, *, speculative=True, hybrid=True, mode="none"):
    rows = torch.arange(len(req_ids) * (1 + K), dtype=torch.int32).view(len(req_ids), 1 + K) + 1
    return hybrid_runner(
        16, speculative=speculative, hybrid=hybrid, mode=mode,
        input_batch=SimpleNamespace(req_ids=req_ids, num_reqs=len(req_ids),
                                    block_table={1: SimpleNamespace(get_device_tensor=lambda n: rows[:n])}),
        num_accepted_tokens=SimpleNamespace(gpu=torch.tensor(accepted + [1] * 4)), rows=rows)


def step(prepare, run, drafts: dict, num_scheduled: list[int], kept: list[int] | None = None):
    """One step: _prepare_inputs, then (``kept``: each row's kept tokens, as the sampler counts them) the counts."""
    result = prepare(run, SimpleNamespace(scheduled_spec_decode_tokens=drafts), np.array(num_scheduled))
    if kept is not None:
        run.num_accepted_tokens.gpu[:len(kept)] = torch.tensor(kept)
        _make_counts(lambda self, output, scheduler_output: None)(run, torch.zeros(len(kept), 1 + K), None)
    return result


def test_a_plain_step_after_a_verify_step_moves_the_accepted_state_once():
    run = runner(["a", "b"], accepted=[3, 1])
    prepare = _make_prepare(lambda self, output, num_scheduled: "inputs")
    # a verify step: untouched; a kept 3 tokens, b kept 1
    assert step(prepare, run, {"a": [7, 8, 9], "b": [4, 5, 6]}, [4, 4], kept=[3, 1]) == "inputs"
    before = {name: tuple(t.clone() for t in run.layers[name].kv_cache) for name in ("linear.0", "linear.1")}
    step(prepare, run, {}, [1, 1])  # the gate's plain step
    for name, (conv0, ssm0) in before.items():
        conv, ssm = run.layers[name].kv_cache
        a_first, a_third, b_first = int(run.rows[0, 0]), int(run.rows[0, 2]), int(run.rows[1, 0])
        assert torch.equal(ssm[a_first], ssm0[a_third])
        assert torch.equal(window(conv[a_first], 0), window(conv0[a_first], 2))
        untouched = torch.ones(len(ssm), dtype=torch.bool)
        untouched[a_first] = False
        assert torch.equal(ssm[untouched], ssm0[untouched]) and torch.equal(conv[untouched], conv0[untouched])
    assert run.luce_recurrent_realigner.rows_moved == 2
    assert run.num_accepted_tokens.gpu[:2].tolist() == [1, 1]  # vLLM's verify path reads slot 0 now (vLLM 0.32)
    moved = [t.clone() for t in run.layers["linear.0"].kv_cache]
    step(prepare, run, {}, [1, 1], kept=[1, 1])
    step(prepare, run, {}, [1, 1])  # a second plain step follows no verify step: nothing moves
    assert all(torch.equal(t, m) for t, m in zip(run.layers["linear.0"].kv_cache, moved))
    assert run.luce_recurrent_realigner.rows_moved == 2


@pytest.mark.parametrize("speculative, hybrid, mode", [(False, True, "none"), (True, False, "none"),
                                                       (True, True, "align"), (True, True, "all")])
def test_engines_without_speculation_recurrent_layers_or_first_slots_are_left_alone(speculative, hybrid, mode):
    run = runner(["a"], accepted=[3], speculative=speculative, hybrid=hybrid, mode=mode)
    prepare = _make_prepare(lambda self, output, num_scheduled: "inputs")
    step(prepare, run, {"a": [1, 2, 3]}, [4])
    assert step(prepare, run, {}, [1]) == "inputs" and run.luce_recurrent_realigner is None


def test_the_patch_applies_to_every_supported_series():
    for target in (TARGET, COUNTS):
        assert all(ledger_signature(target, series) is not None for series in ("0.26", "0.32", "0.33"))


def test_a_request_back_after_a_step_away_reads_the_state_its_verify_step_kept():
    """A request the scheduler leaves out of a step (its token budget spent) leaves the persistent batch; back, vLLM
    counts it as new (accepted 1) and reads slot 0, where its last verify step left the state at slot a - 1."""
    run = runner(["a", "b"], accepted=[1, 1])
    prepare = _make_prepare(lambda self, output, num_scheduled: "inputs")
    step(prepare, run, {"a": [7, 8, 9], "b": [4, 5, 6]}, [4, 4], kept=[3, 2])
    before = [t.clone() for t in run.layers["linear.0"].kv_cache]
    a_rows = run.rows.clone()
    run.input_batch.req_ids, run.input_batch.num_reqs = ["b"], 1  # a is left out: b alone, verifying again
    run.rows[0] = a_rows[1]
    step(prepare, run, {"b": [1, 2, 3]}, [4], kept=[4])
    assert run.luce_recurrent_realigner.rows_moved == 0
    run.input_batch.req_ids, run.input_batch.num_reqs = ["a", "b"], 2  # a is back (vLLM: accepted 1), drafting
    run.rows[:2] = a_rows[:2]
    run.num_accepted_tokens.gpu[:2] = torch.tensor([1, 4])
    step(prepare, run, {"a": [5, 6, 7], "b": [1, 2, 3]}, [4, 4])
    conv, ssm = run.layers["linear.0"].kv_cache
    a_first, a_third = int(a_rows[0, 0]), int(a_rows[0, 2])
    assert torch.equal(ssm[a_first], before[1][a_third])
    assert torch.equal(window(conv[a_first], 0), window(before[0][a_first], 2))
    assert run.luce_recurrent_realigner.rows_moved == 1
    assert run.num_accepted_tokens.gpu[:2].tolist() == [1, 4]  # b verified in the step before: left as vLLM has it


def test_finished_and_preempted_requests_are_forgotten():
    run = runner(["a", "b"], accepted=[1, 1])
    prepare = _make_prepare(lambda self, output, num_scheduled: "inputs")
    step(prepare, run, {"a": [7, 8, 9], "b": [4, 5, 6]}, [4, 4], kept=[3, 2])
    done = SimpleNamespace(scheduled_spec_decode_tokens={}, finished_req_ids={"a"}, preempted_req_ids={"b"})
    run.input_batch.req_ids, run.input_batch.num_reqs = [], 0
    prepare(run, done, np.array([]))
    assert run.luce_recurrent_realigner.verified == {}
