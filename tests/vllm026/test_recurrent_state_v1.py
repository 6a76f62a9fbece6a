"""The vLLM 0.26 runner patch: after _prepare_inputs, rows that decode without drafts right after a verify step get
their Gated DeltaNet state moved to slot 0 (a runner stand-in with vLLM's own MambaSpec; CI runs vLLM 0.32, where
the patch is not applied)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.vllm026.recurrent_state_v1 import TARGET, Realigner, _make_wrapper

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


def runner(req_ids, accepted, *, speculative=True, hybrid=True, mode="none"):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    mamba = MambaSpec(block_size=16, shapes=((2, WIDTH - 1 + K), (4,)), dtypes=(torch.float32, torch.float32))
    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32)
    layers = {"linear.0": GDNLayer(16), "linear.1": GDNLayer(16), "full.0": SimpleNamespace(kv_cache=[])}
    rows = torch.arange(len(req_ids) * (1 + K), dtype=torch.int32).view(len(req_ids), 1 + K) + 1
    return SimpleNamespace(
        speculative_config=object() if speculative else None, model_config=SimpleNamespace(is_hybrid=hybrid),
        cache_config=SimpleNamespace(mamba_cache_mode=mode),
        compilation_config=SimpleNamespace(static_forward_context=layers),
        kv_cache_config=SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=full, layer_names=["full.0"]),
                                                         SimpleNamespace(kv_cache_spec=mamba,
                                                                         layer_names=["linear.0", "linear.1"])]),
        input_batch=SimpleNamespace(req_ids=req_ids, num_reqs=len(req_ids),
                                    block_table={1: SimpleNamespace(get_device_tensor=lambda n: rows[:n])}),
        num_accepted_tokens=SimpleNamespace(gpu=torch.tensor(accepted + [1] * 4)), layers=layers, rows=rows)


def step(prepare, run, drafts: dict, num_scheduled: list[int]):
    return prepare(run, SimpleNamespace(scheduled_spec_decode_tokens=drafts), np.array(num_scheduled))


def test_a_plain_step_after_a_verify_step_moves_the_accepted_state_once():
    run = runner(["a", "b"], accepted=[3, 1])
    prepare = _make_wrapper(lambda self, output, num_scheduled: "inputs")
    assert step(prepare, run, {"a": [7, 8, 9], "b": [4, 5, 6]}, [4, 4]) == "inputs"  # a verify step: untouched
    before = {name: tuple(t.clone() for t in run.layers[name].kv_cache) for name in ("linear.0", "linear.1")}
    step(prepare, run, {}, [1, 1])  # the gate's plain step: a kept 3 tokens, b kept 1
    for name, (conv0, ssm0) in before.items():
        conv, ssm = run.layers[name].kv_cache
        a_first, a_third, b_first = int(run.rows[0, 0]), int(run.rows[0, 2]), int(run.rows[1, 0])
        assert torch.equal(ssm[a_first], ssm0[a_third])
        assert torch.equal(window(conv[a_first], 0), window(conv0[a_first], 2))
        untouched = torch.ones(len(ssm), dtype=torch.bool)
        untouched[a_first] = False
        assert torch.equal(ssm[untouched], ssm0[untouched]) and torch.equal(conv[untouched], conv0[untouched])
    assert run.luce_recurrent_realigner.rows_moved == 2
    moved = [t.clone() for t in run.layers["linear.0"].kv_cache]
    step(prepare, run, {}, [1, 1])  # a second plain step follows no verify step: nothing moves
    assert all(torch.equal(t, m) for t, m in zip(run.layers["linear.0"].kv_cache, moved))
    assert run.luce_recurrent_realigner.rows_moved == 2


@pytest.mark.parametrize("speculative, hybrid, mode", [(False, True, "none"), (True, False, "none"),
                                                       (True, True, "align"), (True, True, "all")])
def test_engines_without_speculation_recurrent_layers_or_first_slots_are_left_alone(speculative, hybrid, mode):
    run = runner(["a"], accepted=[3], speculative=speculative, hybrid=hybrid, mode=mode)
    prepare = _make_wrapper(lambda self, output, num_scheduled: "inputs")
    step(prepare, run, {"a": [1, 2, 3]}, [4])
    assert step(prepare, run, {}, [1]) == "inputs" and run.luce_recurrent_realigner is None


def test_the_patch_applies_to_vllm_0_26_only():
    assert ledger_signature(TARGET, "0.26") is not None
    assert ledger_signature(TARGET, "0.32") is None and ledger_signature(TARGET, "0.33") is None
    assert isinstance(Realigner([], True).drafted, frozenset)
