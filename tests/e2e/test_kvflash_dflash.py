"""DFlash verification on the KVFlash pool (trained target + trained drafter, CPU): with the pool
covering the context, speculative decoding with KVFlash gives exactly the tokens of speculative
decoding with full KV, although drafts are rejected and the pool is rewritten by logical position
at every step. (Speculative vs plain decoding may differ at bf16 near-ties: tests/e2e/test_dflash_parity.py.)"""

from fixtures import trained_llm as F

NO_GATE = {"dflash": {"gate": False}}


def run(luce: dict, prompts=None):
    llm = F.build_llm(2048, drafter=F.trained_model("qwen36-dflash"), disable_log_stats=False,
                      additional_config={"luce": luce})
    prompts = prompts or F.code_prompts(llm.get_tokenizer(), 4)
    drafts0, accepted0, _ = F.spec_counters(llm)
    tokens = F.greedy(llm, prompts, 48)
    drafts, accepted, _ = F.spec_counters(llm)
    runtime = getattr(F.engine_runner(llm), "luce_kvflash", None)
    stats = runtime.stats() if runtime else None
    del llm
    return prompts, tokens, (drafts - drafts0, accepted - accepted0), stats


def test_speculative_verification_on_the_pool_is_lossless():
    prompts, reference, _, _ = run(NO_GATE)
    _, tokens, (drafts, accepted), stats = run({**NO_GATE, "kvflash": {"pool_tokens": 1024}}, prompts)
    assert tokens == reference
    assert drafts and accepted < 15 * drafts  # drafts were rejected, and the pool rolled back by position
    assert stats["page_outs"] == 0
