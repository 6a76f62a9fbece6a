"""How sparse a trained drafter's attention is: the kept block density of FlashPrefill's selection
on each layer of the trained scorer (tests/assets/trained/scorer) over held-out code (CPU, reference code).

    python -m benchmarks.pflash_density --tokens 16384 --alphas 0.12 0.5 0.85 --json out.json

Density = kept causal key blocks / all causal key blocks, over heads and query blocks (block 128,
2 sink blocks, a 4-block window, the last 2 query blocks dense), as the block-sparse kernel keeps them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks import report
from fixtures.trained import heldout_files, trained_model
from vllm_luce.kernels.block_sparse_attention.block_select import keep_mask
from vllm_luce.kernels.block_sparse_attention.naive import block_mean_keys_naive, block_scores_naive
from vllm_luce.pflash.drafter_spec import DrafterSpec
from vllm_luce.pflash.scorer import DrafterScorer, ScoringConfig


def density(scores: torch.Tensor, alpha: float) -> float:
    """Kept causal blocks over all causal blocks, with the selection rule the kernel uses."""
    H, M, _ = scores.shape
    keep = keep_mask(scores, sink_blocks=2, window_blocks=4, last_full_blocks=2, alpha=alpha)
    return float(keep.sum()) / (H * M * (M + 1) / 2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.12, 0.5, 0.85])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(trained_model("tokenizer")))
    ids: list[int] = []
    for f in heldout_files():
        ids += tok.encode(f["text"], add_special_tokens=False)
        if len(ids) >= args.tokens:
            break
    ids = ids[:args.tokens]
    scorer = DrafterScorer(DrafterSpec.load(trained_model("scorer")), "cpu", torch.float32, ScoringConfig(attention="dense"))
    rows, dense = [], scorer._attention

    def measure(q, k, v):
        scores = block_scores_naive(q, block_mean_keys_naive(k, 128), 128)
        rows.append({"layer": len(rows), "tokens": len(ids),
                     **{f"density_a{a}": round(density(scores, a), 3) for a in args.alphas}})
        return dense(q, k, v)

    scorer._attention = measure
    scorer.token_scores(ids)
    return report(rows, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
