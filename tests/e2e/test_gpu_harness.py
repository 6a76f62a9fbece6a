"""The GPU tier's engine runner (tests/gpu) on the CPU backend, so that CI catches a broken harness before a
GPU run does: a subprocess engine with the plugin and one without, the report's fields, KVFlash's probe."""

import pytest

from tests.gpu.conftest import llm_args, run_engine

pytestmark = pytest.mark.e2e
CPU = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def test_engine_reports_tokens_class_counters_and_the_kvflash_probe(tiny_model, tmp_path):
    spec = {"model": str(tiny_model("laguna")), "prompts": [list(range(5, 900))], "max_tokens": 8, "rpc": ["kvflash"],
            "kvflash_probe": True,
            "llm": llm_args(max_model_len=2048, dtype="bfloat16", enforce_eager=True,
                            additional_config={"luce": {"kvflash": {"pool_tokens": 384, "gpu_cold": False}}})}
    luce = run_engine(spec, tmp_path, **CPU)
    assert luce["class"] == "LuceLagunaForCausalLM" and len(luce["tokens"][0]) == 8
    assert luce["kvflash"][0]["bound"] and luce["kvflash"][0]["page_outs"] > 0
    probe = luce["kvflash_probe"]
    assert 0 < probe["most_blocks"] <= probe["pool_blocks"] and probe["loads_checked"] == probe["loads_exact"]
    assert luce["counters"]["vllm:luce_kvflash_requests"] >= 0
    alone = run_engine({**spec, "kvflash_probe": False, "rpc": [],
                        "llm": {**spec["llm"], "additional_config": {}}}, tmp_path, plugins=False, **CPU)
    assert alone["class"] == "LagunaForCausalLM" and not any(k.startswith("vllm:luce_") for k in alone["counters"])
