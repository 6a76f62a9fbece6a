"""The tiny `qwen3_6` fixture rewritten as Qwen3_5ForConditionalGeneration (the class of real Qwen3.5/3.6
checkpoints, and the only one vLLM 0.26 serves them with; `fixtures/conditional.py`), through real
vLLM in-process: LuceQwen3_5ForConditionalGeneration serves it with the greedy tokens of the text-only
original (same weights), with M-RoPE on as in real checkpoints, and vLLM builds, loads and runs its tiny
vision tower the way GPU profiling does.

Two engine starts: the rewritten checkpoint with images on, then the text-only original. The rewritten
one gets its `tokenizer/` folder (transformers 5.19 would load the checkpoint's own as Qwen3_5Tokenizer,
whose pre-tokenizer is not the fixture's). On this CPU machine transformers cannot build Qwen's processor
(its AutoVideoProcessor lookup needs the real torchvision), so the engine gets one built from the PIL
image backend and the video processor class."""

import os

import pytest

from tests.e2e.generate_tokens import MAX_TOKENS, build_llm, greedy_run

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def checkpoints(tiny_model, fixtures_root):
    from fixtures.conditional import as_conditional_generation

    text = tiny_model("qwen3_6")
    return text, as_conditional_generation(text, fixtures_root / "qwen3_6-cg")


def _cpu_qwen_processor(model_dir, tokenizer_dir):
    """Qwen3VLProcessor from the checkpoint's files, without transformers' auto video processor."""
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessorPil.from_pretrained(model_dir),
                            tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir),
                            video_processor=Qwen3VLVideoProcessor.from_pretrained(model_dir))


def _profile_image_encoder(worker) -> dict:
    """What GPU profiling does with the tower: the largest dummy image through `embed_multimodal`."""
    import torch

    runner = worker.model_runner
    batch = runner._get_mm_dummy_batch("image", 1)
    visual = runner.model.visual
    with torch.inference_mode():
        embeds = runner.model.embed_multimodal(**batch)
        pixels = batch["pixel_values"]
        if hasattr(visual, "input_norm"):  # vLLM 0.32: the processor's rescale and normalize run in the tower
            pixels = visual.input_norm(pixels, visual.dtype)
    return {"pixel_values": pixels.float(), "grid_thw": batch["image_grid_thw"].tolist(),
            "embeds": torch.cat([e.float() for e in embeds])}


@pytest.fixture(scope="module")
def runs(checkpoints):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM
    from vllm.model_executor.models.qwen3_vl import Qwen3VLProcessingInfo

    from fixtures.conditional import TOKENIZER_DIR

    text_dir, cg_dir = checkpoints
    processor = _cpu_qwen_processor(cg_dir, cg_dir / TOKENIZER_DIR)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Qwen3VLProcessingInfo, "get_hf_processor", lambda self, **kwargs: processor)
        llm = LLM(model=str(cg_dir), tokenizer=str(cg_dir / TOKENIZER_DIR), enforce_eager=True,
                  max_model_len=512, dtype="bfloat16", seed=0, limit_mm_per_prompt={"image": 1, "video": 0})
        cg = {**greedy_run(llm), "uses_mrope": llm.llm_engine.model_config.uses_mrope,
              "visual": llm.apply_model(lambda model: type(model.visual).__name__)[0],
              "encoder": llm.collective_rpc(_profile_image_encoder)[0]}
        del llm
    llm = build_llm(text_dir)
    text = greedy_run(llm)
    del llm
    return {"text": text, "cg": cg}


def test_served_by_the_luce_conditional_generation_class(runs):
    assert runs["text"]["class"] == "LuceQwen3_5ForCausalLM"
    assert runs["cg"]["class"] == "LuceQwen3_5ForConditionalGeneration"
    assert runs["cg"]["uses_mrope"]  # positions are (3, n) as with real checkpoints


def test_greedy_tokens_equal_the_text_only_original(runs):
    assert all(len(tokens) == MAX_TOKENS for tokens in runs["cg"]["tokens"])
    assert runs["cg"]["tokens"] == runs["text"]["tokens"]


def test_vision_tower_loads_and_runs_as_transformers_runs_it(runs, checkpoints):
    """vLLM's encoder on the dummy profiling image equals transformers' tower on the same pixels (bf16
    against float32), so every vision tensor landed where vLLM's mapper puts it."""
    import torch
    from transformers import AutoConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    from fixtures.conditional import VISION_PREFIX, load_tensors

    _, cg_dir = checkpoints
    enc = runs["cg"]["encoder"]
    assert runs["cg"]["visual"] == "Qwen3_VisionTransformer"
    t, h, w = enc["grid_thw"][0]
    config = AutoConfig.from_pretrained(cg_dir)
    assert enc["embeds"].shape == (t * h * w // 4, config.text_config.hidden_size)
    assert h * w >= 16 and torch.isfinite(enc["embeds"]).all()

    tower = Qwen3_5VisionModel(config.vision_config).float().eval()
    weights = {k[len(VISION_PREFIX):]: v.float() for k, v in load_tensors(cg_dir).items()
               if k.startswith(VISION_PREFIX)}
    tower.load_state_dict(weights, strict=True)
    with torch.inference_mode():
        ref = tower(enc["pixel_values"], grid_thw=torch.tensor(enc["grid_thw"])).pooler_output
    cos = torch.nn.functional.cosine_similarity(enc["embeds"], ref, dim=-1)
    assert cos.min() > 0.9999, cos.min()  # a swapped or missing tensor gives 0.3-0.996
