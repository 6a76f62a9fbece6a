"""A drafter that cannot serve stops startup naming the file and the values (no weights loaded)."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from fixtures.trained import trained_model
from vllm_luce.config import LuceConfig, LuceConfigError
from vllm_luce.checkpoint_headers import DrafterError
from vllm_luce.pflash.drafter_spec import DrafterSpec
from vllm_luce.pflash.install import install_pflash


@pytest.fixture
def drafter(tmp_path):
    dst = tmp_path / "drafter"
    shutil.copytree(trained_model("scorer"), dst)
    return dst


def _install(path, vocab=4096, **settings):
    luce = LuceConfig.from_sources({"luce": {"pflash": {"drafter": str(path), **settings}}}, {})
    model_config = SimpleNamespace(get_vocab_size=lambda: vocab)
    return install_pflash(SimpleNamespace(model_config=model_config), luce).summary


def test_the_trained_scorer_is_accepted(drafter):
    spec = DrafterSpec.load(drafter)
    assert (spec.architecture, spec.num_layers, spec.num_heads, spec.num_kv_heads) == ("Qwen3ForCausalLM", 4, 2, 1)
    assert "drafter drafter (Qwen3ForCausalLM, 4 layers, 4 scored)" in _install(drafter)


def test_missing_directory_names_the_key(tmp_path):
    with pytest.raises(LuceConfigError, match=r"luce.pflash.drafter: '.*nope' is not a directory with a config.json"):
        _install(tmp_path / "nope")


def test_drafter_is_required():
    luce = LuceConfig.from_sources({"luce": {"pflash": {"keep_ratio": 0.1}}}, {})
    with pytest.raises(LuceConfigError, match="luce.pflash.drafter: required"):
        install_pflash(SimpleNamespace(model_config=None), luce)


def test_unsupported_architecture(drafter):
    cfg = json.loads((drafter / "config.json").read_text())
    cfg["architectures"] = ["Qwen3_5ForCausalLM"]
    (drafter / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DrafterError, match="architecture 'Qwen3_5ForCausalLM'; supported drafters: Qwen3ForCausalLM"):
        DrafterSpec.load(drafter)


def test_truncated_safetensors(drafter):
    f = drafter / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(DrafterError, match="is truncated: its header describes"):
        DrafterSpec.load(drafter)


def test_pickle_only_directory_is_never_loaded(drafter):
    (drafter / "model.safetensors").unlink()
    (drafter / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(DrafterError, match=r"no \*.safetensors weights \(found pytorch_model.bin: pickle"):
        DrafterSpec.load(drafter)


def test_config_that_disagrees_with_the_weights(drafter):
    cfg = json.loads((drafter / "config.json").read_text())
    cfg["intermediate_size"] = 512
    (drafter / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DrafterError, match=r"mlp.gate_proj.weight' has shape \[384, 128\]; config.json implies \[512, 128\]"):
        DrafterSpec.load(drafter)


def test_early_exit_beyond_the_drafter(drafter):
    with pytest.raises(LuceConfigError, match="luce.pflash.early_exit_layers: got 9; the drafter .* has 4 layers"):
        _install(drafter, early_exit_layers=9)


def test_smaller_vocabulary_without_tokenizer_is_incompatible(drafter):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (drafter / name).unlink()
    with pytest.raises(LuceConfigError, match="vocabulary of 4096 tokens, smaller than the target's 151936"):
        _install(drafter, vocab=151936)
    assert "the target's tokenizer" in _install(drafter, vocab=4096)


def _write_header(path, header) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(64))


@pytest.mark.parametrize("header,expected", [
    (["model.embed_tokens.weight"], "a safetensors header that is a JSON list; expected an object of tensor name"),
    ({"model.embed_tokens.weight": {"dtype": "F32", "data_offsets": [0, 64]}},
     "malformed safetensors header entry for tensor 'model.embed_tokens.weight': got {\"dtype\": \"F32\", "
     "\"data_offsets\": [0, 64]}; expected an object with \"shape\""),
    ({"w": {"dtype": "F32", "shape": "16", "data_offsets": [0, 64]}}, "entry for tensor 'w'"),
    ({"w": {"dtype": "F32", "shape": [16], "data_offsets": [64]}}, "\"data_offsets\" ([begin, end]"),
    ({"w": "F32"}, "entry for tensor 'w': got \"F32\""),
])
def test_malformed_safetensors_header_names_the_file_and_what_was_expected(drafter, header, expected):
    f = drafter / "model.safetensors"
    _write_header(f, header)
    with pytest.raises(DrafterError) as err:
        DrafterSpec.load(drafter)
    assert str(err.value).startswith(f"luce.pflash.drafter: {f} ") and expected in str(err.value), str(err.value)
    with pytest.raises(LuceConfigError, match="luce.pflash.drafter: .*model.safetensors"):
        _install(drafter)  # at startup, where the drafter is checked
