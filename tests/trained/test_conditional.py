"""fixtures/conditional.py without an engine: the Qwen3_5ForConditionalGeneration form of the tiny
`qwen3_6` fixture and of the trained target keeps every language-model tensor bit for bit, adds only a
small vision tower, and tokenizes text as the original does."""

import json

import pytest
import torch

from fixtures import conditional as C
from fixtures.trained import trained_model

KB = 1 << 10
TEXTS = ["def fibonacci(n):\n    ", "import json\n\nclass Encoder", "The quick brown fox", "<|im_start|>user\nhi",
         "x = 12345  # caf\u00e9\n\n\tif x:\r\n        return [x, 'y']"]


@pytest.fixture(scope="module", params=["tiny", "trained"])
def pair(request, tiny_model, tmp_path_factory):
    text = tiny_model("qwen3_6") if request.param == "tiny" else trained_model("qwen36-target")
    return text, C.as_conditional_generation(text, tmp_path_factory.mktemp("cg") / request.param)


def test_language_model_tensors_are_the_originals_bit_for_bit(pair):
    text_dir, cg_dir = pair
    original, converted = C.load_tensors(text_dir), C.load_tensors(cg_dir)
    config = json.loads((cg_dir / "config.json").read_text())
    language = {name: t for name, t in converted.items() if not name.startswith(C.VISION_PREFIX)}
    expected_names = {C.language_model_name(name) for name in original}
    if config["tie_word_embeddings"]:
        expected_names.discard("lm_head.weight")
    assert set(language) == expected_names
    assert all(name.startswith((C.LANGUAGE_MODEL_PREFIX, "lm_head.")) for name in language)
    for name, tensor in original.items():
        new = language.get(C.language_model_name(name))
        if new is None:
            continue
        assert new.dtype == tensor.dtype and new.shape == tensor.shape, name
        assert torch.equal(new.view(torch.uint8), tensor.view(torch.uint8)), name


def test_vision_tower_is_small_and_in_the_checkpoint_layout(pair):
    _, cg_dir = pair
    vision = {n: t for n, t in C.load_tensors(cg_dir).items() if n.startswith(C.VISION_PREFIX)}
    config = json.loads((cg_dir / "config.json").read_text())
    assert set(vision) == {n for n in C.expected_tensors(config) if n.startswith(C.VISION_PREFIX)}
    assert {t.dtype for t in vision.values()} == {torch.bfloat16}
    assert all(torch.isfinite(t.float()).all() for t in vision.values())
    assert sum(t.numel() * t.element_size() for t in vision.values()) < 256 * KB
    assert config["vision_config"]["depth"] == 1
    assert not any(".blocks.1." in n for n in vision)


def test_config_is_the_text_config_inside_a_conditional_generation_config(pair):
    text_dir, cg_dir = pair
    text = json.loads((text_dir / "config.json").read_text())
    config = json.loads((cg_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert config["model_type"] == "qwen3_5" and config["text_config"]["model_type"] == "qwen3_5_text"
    assert config["vision_config"]["out_hidden_size"] == text["hidden_size"]
    assert config["tie_word_embeddings"] == text["tie_word_embeddings"]
    rope = config["text_config"]["rope_parameters"]
    half = int(text["head_dim"] * rope["partial_rotary_factor"]) // 2
    assert sum(rope.pop("mrope_section")) == half and rope.pop("mrope_interleaved") is True
    assert rope == text["rope_parameters"]
    for key, value in text.items():
        if key not in ("architectures", "transformers_version", "rope_parameters"):
            assert config["text_config"][key] == value, key


def test_tokenizer_tokenizes_text_as_before_and_holds_the_vision_tokens(pair):
    from tokenizers import Tokenizer

    text_dir, cg_dir = pair
    before = Tokenizer.from_file(str(text_dir / "tokenizer.json"))
    after = Tokenizer.from_file(str(cg_dir / "tokenizer.json"))
    config = json.loads((cg_dir / "config.json").read_text())
    vocab = config["text_config"]["vocab_size"]
    for text in TEXTS:
        assert after.encode(text).ids == before.encode(text).ids
    ids = list(range(vocab))
    assert after.decode(ids, skip_special_tokens=False) == before.decode(ids, skip_special_tokens=False)
    for name, key in C.VISION_TOKENS:
        assert after.token_to_id(name) == config[key] >= vocab
    for name in ("tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (cg_dir / name).read_bytes() == (text_dir / name).read_bytes()
        if name != "generation_config.json":
            assert (cg_dir / C.TOKENIZER_DIR / name).read_bytes() == (text_dir / name).read_bytes()
    assert (cg_dir / C.TOKENIZER_DIR / "tokenizer.json").read_bytes() == (cg_dir / "tokenizer.json").read_bytes()


def test_tokenizer_folder_loads_as_the_originals_tokenizer(pair):
    """What vLLM loads with `tokenizer=OUT/tokenizer`: the original's tokenization, plus the vision
    tokens (transformers may load OUT's own as Qwen3_5Tokenizer, with Qwen's pre-tokenizer)."""
    from transformers import AutoTokenizer

    text_dir, cg_dir = pair
    before = AutoTokenizer.from_pretrained(text_dir)
    after = AutoTokenizer.from_pretrained(cg_dir / C.TOKENIZER_DIR)
    assert type(after) is type(before)
    for text in TEXTS:
        assert after(text).input_ids == before(text).input_ids
    assert after.eos_token == before.eos_token and after.chat_template == before.chat_template
    config = json.loads((cg_dir / "config.json").read_text())
    assert after.convert_tokens_to_ids("<|image_pad|>") == config["image_token_id"]


def test_rebuild_is_reused_and_byte_identical(tiny_model, tmp_path):
    text_dir = tiny_model("qwen3_6")
    first = C.as_conditional_generation(text_dir, tmp_path / "a")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert C.as_conditional_generation(text_dir, tmp_path / "a") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    second = C.as_conditional_generation(text_dir, tmp_path / "b")
    names = sorted(str(p.relative_to(first)) for p in first.rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(second)) for p in second.rglob("*") if p.is_file())
    assert all((first / n).read_bytes() == (second / n).read_bytes() for n in names)
    assert not list(tmp_path.glob(".*tmp*"))
    other_seed = C.as_conditional_generation(text_dir, tmp_path / "c", seed=1)
    assert (other_seed / "model.safetensors").read_bytes() != (first / "model.safetensors").read_bytes()


def test_refuses_what_is_not_a_text_only_qwen3_5(tmp_path):
    with pytest.raises(ValueError, match="expected a text-only Qwen3_5ForCausalLM"):
        C.as_conditional_generation(trained_model("scorer"), tmp_path / "out")
    assert not (tmp_path / "out").exists()
