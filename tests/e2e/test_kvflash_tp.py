"""KVFlash at tensor parallel size 2 through real vLLM (CPU, V1 runner, two worker processes).

Each rank holds half of the KV heads, so each scores chunks from its own heads; the QK policy's MAX
all-reduce makes the scores, and so every residency decision, the same on both ranks. Checked here
step by step: after every step's plan, both ranks hold the same chunks at the same pool positions.

The CPU backend runs TP=2 with one core per rank (``VLLM_CPU_OMP_THREADS_BIND="0|1"``); its automatic
binding refuses 2 workers on one NUMA node. One engine serves the whole module (about 20 s to start here).
"""

import random

import pytest

from tests.e2e.test_kvflash import blocks_held, kvflash_manager
from fixtures.trained import trained_model

pytestmark = pytest.mark.e2e

POOL, PROMPT, GEN = 512, 4096, 24  # a prompt 8x the pool
# The host tier (gpu_cold off), where the pool caps every request's blocks; the cold tier lends free blocks beyond
# it (tests/e2e/test_kvflash_tiers.py).


def _record_residency(worker):
    """On a worker: after every plan, append each live request's page table (chunk -> pool position)."""
    runtime = worker.model_runner.luce_kvflash
    runtime.test_residency = log = []
    plan = runtime.plan

    def recording(*args, **kwargs):
        out = plan(*args, **kwargs)
        log.append(sorted((req_id, tuple(p.page_table())) for req_id, p in runtime.pagers.items()))
        return out

    runtime.plan = recording


@pytest.fixture(scope="module")
def llm():
    from vllm import LLM

    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    engine = LLM(str(trained_model("qwen36-target")), tensor_parallel_size=2, distributed_executor_backend="mp",
                 max_model_len=PROMPT + 64, enforce_eager=True, dtype="bfloat16", enable_prefix_caching=False,
                 additional_config={"luce": {"kvflash": {"pool_tokens": POOL, "policy": "qk", "gpu_cold": False}}})
    engine.collective_rpc(_record_residency)
    yield engine
    mp.undo()
    del engine


@pytest.fixture(scope="module")
def run(llm):
    from vllm import SamplingParams

    rng = random.Random(7)
    prompts = [{"prompt_token_ids": [rng.randrange(100, 4000) for _ in range(n)]} for n in (PROMPT, 1500)]
    with blocks_held(llm) as held:
        outs = llm.generate(prompts, SamplingParams(max_tokens=GEN, temperature=0, ignore_eos=True), use_tqdm=False)
    return outs, held


def test_prompt_8x_the_pool_completes_with_the_pool_cap_held(llm, run):
    outs, held = run
    assert [len(o.outputs[0].token_ids) for o in outs] == [GEN, GEN]
    assert held and max(held) <= kvflash_manager(llm).kv_cache_spec.pool_blocks


def test_both_ranks_make_the_same_residency_decision_at_every_step(llm, run):
    stats = llm.collective_rpc(lambda worker: worker.model_runner.luce_kvflash.stats())
    assert len(stats) == 2
    decisions = ("page_outs", "page_ins", "moves", "reselections", "dropped", "bytes_out", "bytes_in")
    rank0, rank1 = ({k: s[k] for k in decisions} for s in stats)
    assert rank0 == rank1
    assert stats[0]["page_outs"] > 0 and stats[0]["reselections"] > 0, stats[0]
    tables = llm.collective_rpc(lambda worker: worker.model_runner.luce_kvflash.test_residency)
    assert tables[0] == tables[1]
    assert any(len(step) == 2 for step in tables[0])  # both requests were live together
