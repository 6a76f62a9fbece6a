"""vLLM 0.32 (CPU) alone, without vllm-luce: a 320-token step budget changes a greedy output far from a near-tie.

    python scripts/repro_step_budget_divergence.py    # about 2 minutes on 2 cores

The load test's one KVFlash mismatch (request 10 first differs at token 20, where the features-off
reference's top-2 gap is 4.4 nats) is this. KVFlash caps the step budget at what fits its pool
(``PagerConfig.max_step_tokens``: 320 tokens for the load test's 512-token pool), and vLLM itself,
with plugins off and only ``max_num_batched_tokens`` / ``long_prefill_token_threshold`` set to 320,
produces the same tokens for that request when it runs in a batch of the workload's first 64 requests.
Alone, the request decodes the same under either budget.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["VLLM_PLUGINS"] = "none"  # vllm-luce not loaded
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm import LLM, SamplingParams  # noqa: E402

from fixtures import serve_load as L  # noqa: E402
from fixtures.trained import trained_model  # noqa: E402


def outputs(budget: int | None, prompts: list[str], params: list[SamplingParams]) -> list[list[int]]:
    extra = {"max_num_batched_tokens": budget, "long_prefill_token_threshold": budget} if budget else {}
    llm = LLM(str(trained_model("qwen36-target")), max_model_len=4096, dtype="bfloat16", enable_prefix_caching=False,
              max_num_seqs=32, seed=0, **extra)
    alone = llm.generate([prompts[10]], [params[10]])[0].outputs[0].token_ids
    batch = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    del llm
    return [list(alone)] + [list(t) for t in batch]


def main() -> int:
    items = L.workload(64)
    prompts = [it.prompt for it in items]
    params = [SamplingParams(temperature=0.0, max_tokens=L.MAX_TOKENS[it.kind]) for it in items]
    default, capped = outputs(None, prompts, params), outputs(320, prompts, params)
    print("request 10 alone, default budget == 320-token budget:", default[0] == capped[0])
    print("request 10 in the batch, default budget == 320-token budget:", default[11] == capped[11])
    first = next((i for i, (a, b) in enumerate(zip(default[11], capped[11])) if a != b), None)
    print("first differing token:", first, "default:", default[11][first:first + 4] if first is not None else "",
          "320:", capped[11][first:first + 4] if first is not None else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
