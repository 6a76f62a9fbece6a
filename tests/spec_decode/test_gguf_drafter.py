"""GGUF drafters in Lucebox's layout: conversion, reading back, shape cross-checks (pure)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm_luce.cli import main as cli
from vllm_luce.spec_decode import gguf_drafter as G


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, request):
    """A small drafter with sliding-window layers and odd sizes, built from config alone."""
    root = tmp_path_factory.mktemp("drafter")
    cfg = {"architectures": ["DFlashDraftModel"], "hidden_size": 96, "intermediate_size": 160, "num_hidden_layers": 3,
           "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 321,
           "rms_norm_eps": 1e-6, "rope_theta": 5e5, "max_position_embeddings": 4096, "block_size": 8,
           "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "sliding_window": 512,
           "dflash_config": {"mask_token_id": 7, "target_layer_ids": [0, 3]}}
    g = torch.Generator().manual_seed(0)
    shapes = {"fc.weight": (96, 192), "hidden_norm.weight": (96,), "norm.weight": (96,)}
    for i in range(3):
        p = f"layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (96, 96), p + "self_attn.k_proj.weight": (32, 96),
                       p + "self_attn.v_proj.weight": (32, 96), p + "self_attn.o_proj.weight": (96, 96),
                       p + "self_attn.q_norm.weight": (32,), p + "self_attn.k_norm.weight": (32,),
                       p + "mlp.gate_proj.weight": (160, 96), p + "mlp.up_proj.weight": (160, 96),
                       p + "mlp.down_proj.weight": (96, 160), p + "input_layernorm.weight": (96,),
                       p + "post_attention_layernorm.weight": (96,)})
    state = {k: torch.randn(v, generator=g).to(torch.bfloat16) for k, v in shapes.items()}
    (root / "config.json").write_text(json.dumps(cfg))
    save_file(state, str(root / "model.safetensors"))
    return root, cfg, state


@pytest.mark.parametrize("linear_type, tolerance", [("bf16", 0.0), ("f16", 1e-2), ("q8_0", 5e-2)])
def test_round_trip(drafter, tmp_path, linear_type, tolerance):
    root, cfg, state = drafter
    out = tmp_path / "d.gguf"
    assert cli(["convert-drafter", str(root), str(out), "--linear-type", linear_type]) == 0
    config, back = G.read_gguf(out)
    assert set(back) == set(state)
    for k, v in state.items():
        err = (back[k].float() - v.float()).abs().max().item()
        assert err <= tolerance * max(1.0, v.float().abs().max().item()), (k, err)
    assert config["layer_types"] == cfg["layer_types"] and config["sliding_window"] == 512
    assert config["dflash_config"] == cfg["dflash_config"] and config["block_size"] == 8
    assert (config["hidden_size"], config["num_key_value_heads"], config["head_dim"]) == (96, 1, 32)
    assert config["rope_parameters"]["rope_theta"] == 5e5


def test_gguf_keys_and_tensor_names_are_lucebox_layout(drafter, tmp_path):
    import gguf

    root, _, _ = drafter
    G.write_gguf(root, tmp_path / "d.gguf")
    reader = gguf.GGUFReader(str(tmp_path / "d.gguf"))
    arch = "gemma4-dflash-draft"  # it has sliding-window layers
    for key in ("dflash.mask_token_id", "dflash.target_layer_ids", "dflash.block_size", "dflash.n_target_layers",
                "attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base", "block_count"):
        assert f"{arch}.{key}" in reader.fields, key
    names = {t.name for t in reader.tensors}
    assert {"dflash.fc.weight", "dflash.hidden_norm.weight", "output_norm.weight", "blk.2.attn_k.weight",
            "blk.0.ffn_gate.weight", "blk.1.attn_q_norm.weight"} <= names
    norms = [t for t in reader.tensors if t.name.endswith("norm.weight")]
    assert norms and all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in norms)


def test_config_that_disagrees_with_the_weights_is_refused(drafter, tmp_path, capsys):
    root, cfg, _ = drafter
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    (bad / "config.json").write_text(json.dumps({**cfg, "num_key_value_heads": 3}))
    assert cli(["convert-drafter", str(bad), str(tmp_path / "x.gguf")]) == 1
    err = capsys.readouterr().err
    assert "layers.0.self_attn.k_proj.weight: weights (32, 96) vs config (96, 96)" in err


def test_non_dflash_checkpoint_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, "num_hidden_layers": 1, "intermediate_size": 8,
                                                      "num_attention_heads": 1, "num_key_value_heads": 1,
                                                      "vocab_size": 8, "rms_norm_eps": 1e-6, "rope_theta": 1.0}))
    with pytest.raises(G.DrafterFormatError, match="is this a DFlash drafter"):
        G.write_gguf(tmp_path, tmp_path / "x.gguf")


def test_materialize_is_cached_by_content(drafter, tmp_path):
    root, _, state = drafter
    G.write_gguf(root, tmp_path / "d.gguf")
    first = G.materialize(tmp_path / "d.gguf", tmp_path / "cache")
    assert G.materialize(tmp_path / "d.gguf", tmp_path / "cache") == first
    loaded = load_file(str(first / "model.safetensors"))
    assert torch.equal(loaded["fc.weight"], state["fc.weight"])
    assert json.loads((first / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]


def test_materialize_announces_the_file_it_prepares_and_says_whether_it_converted(drafter, tmp_path, luce_log):
    root, _, _ = drafter
    gguf = tmp_path / "d.gguf"
    G.write_gguf(root, gguf)
    out = G.materialize(gguf, tmp_path / "cache")
    G.materialize(gguf, tmp_path / "cache")
    lines = [r.getMessage() for r in luce_log.records]
    start = f"DFlash: preparing the GGUF drafter {gguf} for vLLM"
    assert len(lines) == 4 and start in lines[0] and start in lines[2], lines
    assert lines[0].endswith(f"({gguf.stat().st_size / 2**30:.2f} GiB)")
    assert f"DFlash: GGUF drafter ready at {out} (converted now) in " in lines[1]
    assert f"DFlash: GGUF drafter ready at {out} (cached conversion) in " in lines[3]


def test_convert_drafter_prints_what_it_converts_before_it_starts_and_the_time_after(drafter, tmp_path, capsys):
    root, _, _ = drafter
    assert cli(["convert-drafter", str(root), str(tmp_path / "d.gguf")]) == 0
    start, done = capsys.readouterr().out.splitlines()
    weights = (root / "model.safetensors").stat().st_size
    assert start == (f"converting {root} ({weights / 2**30:.2f} GiB of safetensors) to {tmp_path / 'd.gguf'} "
                     "with bf16 linears")
    assert done.startswith(f"wrote {tmp_path / 'd.gguf'}: ") and done.endswith(" s") and "; in " in done
