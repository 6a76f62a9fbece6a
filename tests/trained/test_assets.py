"""The committed trained assets and their loader (fixtures/trained.py)."""

import json
import shutil

import pytest

from fixtures import trained as T

MB = 1 << 20


def test_manifest_sizes_within_budget():
    files = T.manifest()["files"]
    assert max(f["bytes"] for f in files) <= 16 * MB
    assert sum(f["bytes"] for f in files) <= 40 * MB


def test_every_model_verifies():
    for name in T.MODELS:
        assert T.trained_model(name).is_dir()
    assert len(T.heldout_files()) > 50


def test_unknown_name_and_corruption_are_reported(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="expected one of"):
        T.trained_model("qwen9")
    copy = tmp_path / "trained"
    shutil.copytree(T.ASSETS, copy)
    weights = copy / "scorer" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(T, "ASSETS", copy)
    T.manifest.cache_clear()
    T.trained_model.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="sha256"):
            T.trained_model("scorer")
    finally:
        T.manifest.cache_clear()
        T.trained_model.cache_clear()


def test_configs_are_what_vllm_serves():
    target = json.loads((T.trained_model("qwen36-target") / "config.json").read_text())
    drafter = json.loads((T.trained_model("qwen36-dflash") / "config.json").read_text())
    assert target["architectures"] == ["Qwen3_5ForCausalLM"]
    assert target["layer_types"] == (["linear_attention"] * 3 + ["full_attention"]) * 2
    assert target["linear_key_head_dim"] == target["linear_value_head_dim"] == 128  # CPU GDN kernel
    assert drafter["architectures"] == ["DFlashDraftModel"]
    ids = drafter["dflash_config"]["target_layer_ids"]
    # vLLM captures "output of layer i" as the input of layer i + 1, which must exist.
    assert max(ids) + 1 < target["num_hidden_layers"]
    assert drafter["hidden_size"] == target["hidden_size"]
