"""Offline study of KVFlash chunk summaries on the trained fixture (issue 41): where does the needle's chunk rank
among the chunks a prompt-end reselection chooses from, for each summary and query set?

    python -m benchmarks.kvflash_summary_study --tokens 2048 4096 8192 --seeds 4 [--distractors 2]
    python -m benchmarks.kvflash_summary_study --model scorer   # the trained Qwen3 dense scorer: RoPE on every dim

For each needle prompt (``fixtures/needle.py``, depths 0.1-0.9) the trained target runs once in HF
transformers on the CPU (fp32) with the post-RoPE keys of its two full-attention layers and the queries of the
prompt's last 9 tokens captured. Chunks are 64 tokens; the candidates are what a reselection ranks: every full
chunk but the sink and the 4 recent ones. A prompt counts for ``top3`` (``top11``) when every chunk holding the
needle's digits is among the 3 (11) best, the selectable chunks of a 512 (1024) token pool, or protected.

Query sets: ``token before last`` (what the pager had at the prompt's end before ``query_window``), ``window 8``
(the 8 tokens before the last, ``query_window: 8``) and ``last token`` (the question's last token itself, which no
reselection can have: it runs after the pool is chosen). Summaries, each scored with the policy's own rule and the
maximum over query rows, heads and (but for qk) layers; bytes per chunk relative to qk's fp32 mean keys:
* ``qk`` (1x): cosine with the mean key, mean over layers;
* ``bounds`` (2x): fp8 outward min/max per 16-token page, Quest's upper bound;
* ``bounds/64`` (0.5x): the same over whole chunks;
* ``salient/1-key`` (0.25x): the fp8 key farthest from the chunk's mean key, ``q . k`` (the policy's summary until
  the two-key one);
* ``salient/1-key/no-rope``: the same without the head dims RoPE rotates (the fixture rotates a quarter);
* ``salient`` (0.2x on the fixture): the policy's summary and score (``policies.Salient``): two int4 keys of the
  unrotated dims (where every dim rotates, as in the scorer: all but the two fastest-rotating pairs; 0.25x), the
  best logit over both, and at least the preceding chunk's score;
* ``salient/every-dim``: the same summary of every head dim (0.26x where every dim rotates);
* ``exact``: the largest logit over all of the chunk's keys (no summary; SFI's ``attention``).
This is a ranking proxy: through vLLM the queries come from a pooled prefill and the pool's recent tail is the
prompt's; ``benchmarks/kvflash_needle.py`` measures retrieval itself.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from benchmarks import report
from fixtures import needle as N
from fixtures.trained import heldout_files, trained_model
from vllm_luce.kernels.scored_dims import FAST_PAIRS, ScoredDims

CHUNK, PAGE, WINDOW = 64, 16, 8


MODELS = {"qwen36-target": "transformers.models.qwen3_5.modeling_qwen3_5",
          "scorer": "transformers.models.qwen3.modeling_qwen3"}


def capture(tokens: int, seeds: int, distractors: int, name: str = "qwen36-target") -> list[dict]:
    """Keys [layers, kv_heads, T, D] (bf16, as vLLM's cache holds them), the last 9 tokens' queries and the
    digits' token indices of every needle prompt, from the trained model ``name`` (its full-attention layers)."""
    import importlib

    from transformers import AutoModelForCausalLM, AutoTokenizer

    qwen = importlib.import_module(MODELS[name])
    tokenizer = AutoTokenizer.from_pretrained(str(trained_model("tokenizer")))
    model = AutoModelForCausalLM.from_pretrained(trained_model(name), dtype=torch.float32).eval()
    head = model.config.head_dim
    rotated = int(head * (getattr(model.config, "partial_rotary_factor", None) or 1.0))
    seen, rotary = [], qwen.apply_rotary_pos_emb

    def keep(q, k, *args, **kwargs):
        q, k = rotary(q, k, *args, **kwargs)
        seen.append((q[0, :, -WINDOW - 1:], k[0]))
        return q, k

    qwen.apply_rotary_pos_emb = keep
    try:
        out = []
        for case in N.make_cases(tokenizer, list(heldout_files()), tokens=tokens, depths=(0.1, 0.3, 0.5, 0.7, 0.9),
                                 seeds=range(seeds), distractors=distractors):
            enc = tokenizer(case.prompt, add_special_tokens=False, return_offsets_mapping=True)
            asked = case.prompt.rsplit("\n", 1)[1]
            at = case.prompt.index(asked + case.answer) + len(asked)
            digits = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < at + N.NEEDLE_DIGITS and b > at]
            seen.clear()
            with torch.no_grad():
                model(input_ids=torch.tensor([enc["input_ids"]]), use_cache=False)
            out.append({"keys": torch.stack([k for _, k in seen]).to(torch.bfloat16),
                        "queries": torch.stack([q for q, _ in seen]).float(), "digits": digits,
                        "rope_dims": rotated % head,  # the leading ones; 0 where every dim rotates
                        "scored": ScoredDims(rotated) if rotated < head else ScoredDims(FAST_PAIRS, head // 2)})
        return out
    finally:
        qwen.apply_rotary_pos_emb = rotary


def _grouped(queries: torch.Tensor, hkv: int) -> torch.Tensor:
    """[L, Hq, W, D] -> [L, Hkv, group x W, D]."""
    layers, hq, w, d = queries.shape
    return queries.reshape(layers, hkv, hq // hkv * w, d)


def _box(q, lo, hi):
    """Per chunk and layer, the max over boxes and query rows of sum_d max(q_d lo_d, q_d hi_d) / sqrt(D).
    q [L, Hkv, R, D]; lo/hi [C, L, boxes, Hkv, D] -> [C, L]."""
    b = torch.einsum("lhrd,clbhd->clbhr", q.clamp(min=0), hi) + torch.einsum("lhrd,clbhd->clbhr", q.clamp(max=0), lo)
    return torch.nan_to_num(b, nan=float("inf")).flatten(2).amax(-1) / math.sqrt(q.shape[-1])


def _fp8_outward(lo, hi):
    lo = torch.where(lo > 0, lo * 0.75, lo * 1.25) - 2.0 ** -15
    hi = torch.where(hi > 0, hi * 1.25, hi * 0.75) + 2.0 ** -15
    return lo.to(torch.float8_e5m2).float(), hi.to(torch.float8_e5m2).float()


def score(summary: str, keys: torch.Tensor, queries: torch.Tensor, chunks: int, rope_dims: int = 0,
          scored: ScoredDims = ScoredDims()) -> torch.Tensor:
    """[chunks] scores of ``summary`` with query rows [L, Hq, W, D]; the ``no-rope`` one-key summary leaves out the
    leading ``rope_dims`` that RoPE rotates, ``salient`` keeps the ``scored`` dims (the policy's)."""
    layers, hkv, _, d = keys.shape
    if summary == "salient/every-dim":
        summary, scored = "salient", ScoredDims()
    if summary == "salient/1-key/no-rope":
        summary, queries = "salient/1-key", queries.clone()
        queries[..., :rope_dims] = 0
    k = keys[:, :, : chunks * CHUNK].float().reshape(layers, hkv, chunks, CHUNK, d).permute(2, 0, 3, 1, 4)  # C L T H D
    q = _grouped(queries, hkv)
    if summary == "qk":
        mean = k.mean(2)  # [C, L, H, D]
        cos = torch.nn.functional.cosine_similarity(q[None], mean[:, :, :, None], dim=-1)  # [C, L, H, R]
        return cos.flatten(2).amax(-1).mean(-1)
    if summary == "exact":
        return _box(q, k, k).amax(-1)
    if summary.startswith("bounds"):
        size = CHUNK if summary == "bounds/64" else PAGE
        boxes = k.unflatten(2, (-1, size))  # [C, L, pages, size, H, D]
        return _box(q, *_fp8_outward(boxes.amin(3), boxes.amax(3))).amax(-1)
    if summary == "salient/1-key":
        dist = (k - k.mean(2, keepdim=True)).square().sum(-1)  # [C, L, T, H]
        pick = torch.where(dist.isnan(), float("inf"), dist).argmax(2)  # [C, L, H], the first farthest
        rep = torch.gather(k, 2, pick[:, :, None, :, None].expand(-1, -1, 1, -1, d)).to(torch.float8_e5m2).float()
        return _box(q, rep, rep).amax(-1)  # rep [C, L, 1, H, D]
    if summary == "salient":
        from vllm_luce.kernels.chunk_salient.naive import salient_from_keys, salient_scores_naive

        packed = torch.stack([salient_from_keys(c, scored) for c in k.to(torch.bfloat16)])  # [C, L, H, 2, bytes]
        rows = queries.reshape(layers, -1, d)  # each head's window rows adjacent, as query_window.py keeps them
        own = salient_scores_naive(rows, packed, scored).amax(-1)
        return torch.cat([own[:1], torch.maximum(own[1:], own[:-1])])  # at least the preceding chunk's score
    raise ValueError(summary)


QUERIES = {"token before last": slice(WINDOW - 1, WINDOW), "window 8": slice(0, WINDOW), "last token": slice(WINDOW, None)}
SUMMARIES = ("qk", "bounds", "bounds/64", "salient/1-key", "salient/1-key/no-rope", "salient", "salient/every-dim",
             "exact")


def rank_all(cases: list[dict]) -> dict:
    found = {}
    for qname, rows in QUERIES.items():
        for summary in SUMMARIES:
            top3 = top11 = 0
            for case in cases:
                keys, t = case["keys"], case["keys"].shape[2]
                chunks, total = t // CHUNK, math.ceil(t / CHUNK)
                candidates = [c for c in range(1, total - 4) if c < chunks]
                s = score(summary, keys, case["queries"][:, :, rows], chunks, case["rope_dims"], case["scored"])[candidates]
                order = [candidates[i] for i in torch.argsort(s, descending=True, stable=True).tolist()]
                rank = max(order.index(c) if c in candidates else -1 for c in {d // CHUNK for d in case["digits"]})
                top3, top11 = top3 + (rank < 3), top11 + (rank < 11)
            found[f"{summary}, {qname}"] = {"top3": round(top3 / len(cases), 2), "top11": round(top11 / len(cases), 2)}
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--distractors", type=int, default=0)
    ap.add_argument("--model", default="qwen36-target", choices=list(MODELS), help="the trained model whose keys")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    rows = {}
    for tokens in args.tokens:
        rows[str(tokens)] = rank_all(capture(tokens, args.seeds, args.distractors, args.model))
        print(json.dumps({"tokens": tokens, **rows[str(tokens)]}), flush=True)
    return report({"model": args.model, "distractors": args.distractors, "cases_per_length": 5 * args.seeds, "ranks": rows}, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
