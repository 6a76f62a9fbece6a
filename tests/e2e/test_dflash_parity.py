"""DFlash draft parity through real vLLM (CPU, V1 runner) on the trained Qwen3.6 pair.

* golden parity: vLLM's drafter logits for a block equal a plain PyTorch reference of z-lab's
  drafter (``fixtures/dflash_model.py``) fed the same target features, within bf16
  tolerance. This test found vLLM's CPU rms_norm ignoring grouped weights
  (``vllm_luce/patches/cpu_rms_norm.py``);
* batch parity: a request's drafts are the same alone and in a batch of 8.
"""

import pytest
import torch

from fixtures import trained_llm as F
from fixtures import dflash_model as D
from tests.e2e.dflash_probe import drafts_by_prompt, engine
from fixtures.trained import trained_model

pytestmark = pytest.mark.e2e
GEN = 24


@pytest.fixture(scope="module")
def spec_llm():
    llm = F.build_llm(1024, drafter=trained_model("qwen36-dflash"), additional_config={"luce": {"dflash": {"gate": False}}})
    yield llm
    del llm


def drafter_model(llm):
    return engine(llm).model_executor.driver_worker.worker.model_runner.drafter.model


def reference_drafter():
    import json

    from safetensors.torch import load_file

    cfg = json.loads((trained_model("qwen36-dflash") / "config.json").read_text())
    ref = D.DFlashDrafter(cfg, cfg["hidden_size"]).eval()
    weights = load_file(str(trained_model("qwen36-dflash") / "model.safetensors"))
    ref.load_state_dict({k: v.float() for k, v in weights.items()})
    return ref, cfg


def test_drafter_logits_match_a_pytorch_reference(spec_llm):
    """First drafting step after prefill (a fresh context: the module, not the context bookkeeping):
    vLLM's logits for the 15 slots vs the reference fed with the features vLLM captured."""
    from vllm import SamplingParams

    model, cap = drafter_model(spec_llm), {}
    forward, compute_logits, combine = model.forward, model.compute_logits, model.combine_hidden_states

    def record_forward(input_ids, positions, inputs_embeds=None):
        cap.setdefault("p", int(positions[0]))
        cap.setdefault("anchor", int(input_ids[0]))
        return forward(input_ids, positions, inputs_embeds)

    def record_logits(hidden_states):
        logits = compute_logits(hidden_states)
        cap.setdefault("logits", logits.float().clone())
        return logits

    def record_features(hidden_states):
        cap.setdefault("features", hidden_states.float().clone())
        return combine(hidden_states)

    ref, cfg = reference_drafter()
    embed = spec_llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model
    embed = embed.model.embed_tokens.weight.float()
    block, mask = cfg["block_size"], cfg["dflash_config"]["mask_token_id"]
    prompts = sum(F.code_prompts(spec_llm.get_tokenizer(), 3), [])
    model.forward, model.compute_logits, model.combine_hidden_states = record_forward, record_logits, record_features
    worst, agree, slots = 0.0, 0, 0
    try:
        for n in (8, 64, 100, 256, 400, 600):
            cap.clear()
            spec_llm.generate([{"prompt_token_ids": prompts[:n]}], SamplingParams(max_tokens=2, temperature=0.0),
                              use_tqdm=False)
            p, logits = cap["p"], cap["logits"]
            tokens = torch.full((1, block), mask)
            tokens[0, 0] = cap["anchor"]
            with torch.no_grad():
                h = ref(cap["features"][None, :p], embed[tokens], torch.tensor([[p]]), block)
                expected = h[0, 1:] @ embed.T
            top = logits.argmax(-1, keepdim=True)
            diff = (torch.log_softmax(logits, -1) - torch.log_softmax(expected, -1)).gather(-1, top).abs()
            worst = max(worst, diff.max().item())
            agree += int((top.squeeze(-1) == expected.argmax(-1)).sum())
            slots += block - 1
    finally:
        del model.forward, model.compute_logits, model.combine_hidden_states
    # bf16 tolerance: a bf16 reference stays within 0.01 nats of the fp32 one on these inputs.
    assert worst < 0.1 and agree / slots > 0.95, (worst, agree, slots)


def test_drafts_are_the_same_alone_and_in_a_batch_of_8(spec_llm):
    prompts = F.code_prompts(spec_llm.get_tokenizer(), 8)
    alone, out_alone = drafts_by_prompt(spec_llm, prompts[:1], GEN)
    batch, out_batch = drafts_by_prompt(spec_llm, prompts, GEN)
    assert out_alone[0] == out_batch[0]
    assert len(alone[0]) >= 3 and alone[0] == batch[0], (alone[0], batch[0])
