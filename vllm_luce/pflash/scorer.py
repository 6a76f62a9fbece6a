"""PFlash scoring core: a small causal LM reads the prompt and scores every token (no vLLM import).

Token importance is SpecPrefill's look-ahead attention (Lucebox's "tail attention"): for each scored
layer, the queries of the last ``lookahead_tokens`` (8) prompt tokens attend over all keys
(pre-RoPE by default, which removes RoPE's distance decay that buries early needles); the
probabilities are reduced by max over heads and layers, averaged over the look-ahead rows and
smoothed by an average pool of ``pool_kernel`` (13) tokens.

The drafter runs layer by layer over the whole prompt in memory linear in its length: attention is
the block-sparse Triton kernel on CUDA (FlashPrefill) or PyTorch's causal SDPA elsewhere; the tail
scores never form an S x S matrix (Triton ``tail_score`` on CUDA); the MLP runs in token chunks.
With ``early_exit_layers = N`` only the first N layers are read and scored, and the last one needs
only its queries and keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from vllm_luce.checkpoint_headers import DrafterError
from vllm_luce.pflash.drafter_spec import DrafterSpec


@dataclass(frozen=True)
class ScoringConfig:
    lookahead_tokens: int = 8
    pool_kernel: int = 13
    pre_rope: bool = True
    early_exit_layers: int = 0      # 0: every layer
    attention: str = "auto"         # "auto" (sparse on CUDA), "dense", "sparse"
    sparse_alpha: float = 0.12
    sparse_block: int = 128
    token_chunk: int = 8192         # rows per MLP / RoPE pass


def choose_dtype(device: torch.device, requested: str = "auto") -> torch.dtype:
    """bf16 on GPUs that support it, fp16 on older ones (Lucebox seed 002), fp32 on CPU; or as asked."""
    if requested != "auto":
        return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[requested]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


class DrafterScorer:
    def __init__(self, spec: DrafterSpec, device: torch.device | str, dtype: torch.dtype,
                 cfg: ScoringConfig = ScoringConfig()):
        self.spec, self.cfg, self.dtype = spec, cfg, dtype
        self.device = torch.device(device)
        n = cfg.early_exit_layers or spec.num_layers
        if not 1 <= n <= spec.num_layers:
            raise DrafterError(f"luce.pflash.early_exit_layers: got {cfg.early_exit_layers}; the drafter "
                               f"{spec.path} has {spec.num_layers} layers")
        self.num_layers = n
        self.w = self._load(spec.expected_shapes(n))
        half = spec.head_dim // 2
        self.inv_freq = spec.rope_theta ** (-torch.arange(0, half, device=self.device, dtype=torch.float32) / half)

    def _load(self, names: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
        from safetensors import safe_open

        by_file: dict[str, list[str]] = {}
        for name in names:
            by_file.setdefault(self.spec.tensors[name][0], []).append(name)
        out = {}
        for file, tensor_names in by_file.items():
            with safe_open(str(self.spec.path / file), framework="pt", device="cpu") as f:
                for name in tensor_names:
                    out[name] = f.get_tensor(name).to(device=self.device, dtype=self.dtype)
        return out

    WARM_UP_LENGTHS = (515, 4103, 4096)  # one key split and two; Triton specializes lengths divisible by 16
    WARM_UP_SECONDS = 20  # roughly what compiling and tuning take on a GPU (docs/gpu.md, "Latest results")

    def warm_up(self) -> None:
        """On a GPU, score synthetic prompts so that Triton compiles and autotunes the scoring kernels at
        load: left to the first request, it would be most of that request's time to first token (docs/gpu.md,
        "Latest results"). Tuning keys are block sizes and head dims, never the length; the
        lengths cover the compiled variants (single or split keys, lengths divisible by 16 or not).
        Elsewhere nothing compiles."""
        if self.device.type == "cuda":
            for length in self.WARM_UP_LENGTHS:
                self.token_scores([t % self.spec.vocab_size for t in range(length)])

    def peak_bytes(self, tokens: int) -> int:
        """Device bytes a pass over a prompt of ``tokens`` tokens allocates at its peak beyond what the scorer holds,
        measured by scoring a synthetic prompt of that length (on a GPU; elsewhere 0: no device budget to keep)."""
        if self.device.type != "cuda" or tokens < 1:
            return 0
        return measured_peak(lambda: self.token_scores([t % self.spec.vocab_size for t in range(tokens)]), self.device)

    @torch.inference_mode()
    def token_scores(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """fp32 [S] importance of each prompt token (on CPU)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten().to(self.device)
        S, L = ids.numel(), min(self.cfg.lookahead_tokens, ids.numel())
        if S == 0:
            raise ValueError("token_scores: empty prompt")
        if int(ids.max()) >= self.spec.vocab_size or int(ids.min()) < 0:
            raise ValueError(f"token_scores: token id outside the drafter's vocabulary of {self.spec.vocab_size}")
        pos = torch.arange(S, device=self.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        h = F.embedding(ids, self.w["model.embed_tokens.weight"])
        running = torch.zeros(L, S, dtype=torch.float32, device=self.device)
        for i in range(self.num_layers):
            h = self._layer(i, h, cos, sin, running, last=i == self.num_layers - 1)
        score = running.mean(0)
        k = self.cfg.pool_kernel
        if k > 1:
            score = F.avg_pool1d(score[None, None], k, stride=1, padding=k // 2, count_include_pad=False)[0, 0]
        return score[:S].cpu()

    def _layer(self, i, h, cos, sin, running, last: bool):
        spec, w, p = self.spec, self.w, f"model.layers.{i}."
        S, D = h.shape[0], spec.head_dim
        x = _rms_norm(h, w[p + "input_layernorm.weight"], spec.rms_eps)
        q = F.linear(x, w[p + "self_attn.q_proj.weight"], w.get(p + "self_attn.q_proj.bias")).view(S, -1, D)
        k = F.linear(x, w[p + "self_attn.k_proj.weight"], w.get(p + "self_attn.k_proj.bias")).view(S, -1, D)
        v = None if last else F.linear(x, w[p + "self_attn.v_proj.weight"],
                                       w.get(p + "self_attn.v_proj.bias")).view(S, -1, D)
        del x
        if spec.qk_norm:
            q = _rms_norm(q, w[p + "self_attn.q_norm.weight"], spec.rms_eps)
            k = _rms_norm(k, w[p + "self_attn.k_norm.weight"], spec.rms_eps)
        L = running.shape[0]
        if self.cfg.pre_rope:
            self._tail(q[S - L:], k, running)
        self._rope_(q, cos, sin)
        self._rope_(k, cos, sin)
        if not self.cfg.pre_rope:
            self._tail(q[S - L:], k, running)
        if last:
            return h
        attn = self._attention(q, k, v)
        del q, k, v
        h = h + F.linear(attn.reshape(S, -1), w[p + "self_attn.o_proj.weight"])
        del attn
        for a in range(0, S, self.cfg.token_chunk):
            part = _rms_norm(h[a:a + self.cfg.token_chunk], w[p + "post_attention_layernorm.weight"], spec.rms_eps)
            part = F.silu(F.linear(part, w[p + "mlp.gate_proj.weight"])) * F.linear(part, w[p + "mlp.up_proj.weight"])
            h[a:a + self.cfg.token_chunk] += F.linear(part, w[p + "mlp.down_proj.weight"])
        return h

    def _tail(self, q_tail, k, running):
        if self.device.type == "cuda":
            from vllm_luce.kernels.tail_score import tail_score

            tail_score(q_tail, k, out=running, accumulate=True)
        else:
            from vllm_luce.kernels.tail_score import tail_score_naive

            tail_score_naive(q_tail, k, out=running, accumulate=True)

    def _rope_(self, x, cos, sin):
        """In place, NeoX half rotation, in token chunks (fp32 math)."""
        half = x.shape[-1] // 2
        for a in range(0, x.shape[0], self.cfg.token_chunk):
            b = a + self.cfg.token_chunk
            c, s = cos[a:b, None, :], sin[a:b, None, :]
            x1, x2 = x[a:b, :, :half].float().clone(), x[a:b, :, half:].float().clone()
            x[a:b, :, :half] = (x1 * c - x2 * s).to(x.dtype)
            x[a:b, :, half:] = (x2 * c + x1 * s).to(x.dtype)

    def _attention(self, q, k, v):
        mode = self.cfg.attention
        if mode == "sparse" or (mode == "auto" and self.device.type == "cuda"):
            from vllm_luce.kernels.block_sparse_attention import block_sparse_attention

            return block_sparse_attention(q, k, v, block_size=self.cfg.sparse_block, alpha=self.cfg.sparse_alpha)
        group = q.shape[1] // k.shape[1]
        qt, kt, vt = (t.transpose(0, 1)[None] for t in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)))
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)[0].transpose(0, 1)


def measured_peak(run: Callable[[], object], device: torch.device, memory=torch.cuda) -> int:
    """Bytes ``run`` allocates on ``device`` at its peak beyond what was allocated before it (``memory``: torch.cuda's
    counters)."""
    memory.synchronize(device)
    before = memory.memory_allocated(device)
    memory.reset_peak_memory_stats(device)
    run()
    memory.synchronize(device)
    return max(0, memory.max_memory_allocated(device) - before)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
