"""What a PFlash drafter checkpoint is, read and checked without loading its weights (no vLLM import).

A drafter is any Hugging Face causal LM directory of the Llama family layout (Qwen3, Qwen2, Llama,
Mistral): ``config.json`` and safetensors (one file or an index). ``DrafterSpec.load`` reads the
config, opens every safetensors header, and checks each tensor the scorer needs against the shape
the config implies, so a wrong, truncated or incompatible drafter stops startup with the file and
the values named. Pickle checkpoints (``*.bin``, ``*.pt``) are never read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vllm_luce.checkpoint_headers import DrafterError, read_headers

# architecture -> (per-head q/k RMSNorm, q/k/v projection bias)
ARCHITECTURES: dict[str, tuple[bool, bool]] = {
    "Qwen3ForCausalLM": (True, False),
    "Qwen2ForCausalLM": (False, True),
    "LlamaForCausalLM": (False, False),
    "MistralForCausalLM": (False, False),
}


@dataclass(frozen=True)
class DrafterSpec:
    path: Path
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_eps: float
    qk_norm: bool
    qkv_bias: bool
    tensors: dict[str, tuple[str, tuple[int, ...]]]  # name -> (file, shape)

    @classmethod
    def load(cls, path: str | Path, where: str = "luce.pflash.drafter") -> "DrafterSpec":
        root = Path(path).expanduser()
        cfg_file = root / "config.json"
        if not cfg_file.is_file():
            raise DrafterError(f"{where}: {str(path)!r} is not a directory with a config.json "
                               "(expected a Hugging Face causal LM such as Qwen3-0.6B)")
        try:
            cfg = json.loads(cfg_file.read_text())
        except ValueError as e:
            raise DrafterError(f"{where}: {cfg_file} is not valid JSON ({e})") from None
        cfg = cfg.get("text_config", cfg) if "hidden_size" not in cfg else cfg
        arch = next(iter(cfg.get("architectures") or []), None)
        if arch not in ARCHITECTURES:
            raise DrafterError(f"{where}: {cfg_file} declares architecture {arch!r}; supported drafters: "
                               f"{', '.join(ARCHITECTURES)}")
        qk_norm, qkv_bias = ARCHITECTURES[arch]
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
            spec = cls(
                path=root, architecture=arch, vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
                num_layers=int(cfg["num_hidden_layers"]), num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                intermediate_size=int(cfg["intermediate_size"]),
                rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
                rms_eps=float(cfg.get("rms_norm_eps", 1e-6)), qk_norm=qk_norm,
                qkv_bias=bool(cfg.get("attention_bias", qkv_bias)), tensors=read_headers(root, where))
        except KeyError as e:
            raise DrafterError(f"{where}: {cfg_file} has no {e.args[0]!r}") from None
        if spec.num_heads % spec.num_kv_heads:
            raise DrafterError(f"{where}: {cfg_file}: {spec.num_heads} attention heads do not group over "
                               f"{spec.num_kv_heads} key/value heads")
        spec.check_tensors(spec.num_layers, where)
        return spec

    def expected_shapes(self, num_layers: int) -> dict[str, tuple[int, ...]]:
        """Every tensor the scorer reads for its first ``num_layers`` layers, with its shape."""
        H, D, Hkv, I = self.hidden_size, self.head_dim, self.num_kv_heads, self.intermediate_size
        out = {"model.embed_tokens.weight": (self.vocab_size, H)}
        for i in range(num_layers):
            p = f"model.layers.{i}."
            out.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                        p + "self_attn.q_proj.weight": (self.num_heads * D, H),
                        p + "self_attn.k_proj.weight": (Hkv * D, H), p + "self_attn.v_proj.weight": (Hkv * D, H),
                        p + "self_attn.o_proj.weight": (H, self.num_heads * D),
                        p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                        p + "mlp.down_proj.weight": (H, I)})
            if self.qk_norm:
                out.update({p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,)})
            if self.qkv_bias:
                out.update({p + "self_attn.q_proj.bias": (self.num_heads * D,),
                            p + "self_attn.k_proj.bias": (Hkv * D,), p + "self_attn.v_proj.bias": (Hkv * D,)})
        return out

    def check_tensors(self, num_layers: int, where: str) -> None:
        for name, shape in self.expected_shapes(num_layers).items():
            if name not in self.tensors:
                raise DrafterError(f"{where}: {self.path} has no tensor {name!r} (expected shape {list(shape)} "
                                   f"from config.json)")
            file, actual = self.tensors[name]
            if tuple(actual) != shape:
                raise DrafterError(f"{where}: {self.path / file}: tensor {name!r} has shape {list(actual)}; "
                                   f"config.json implies {list(shape)}")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def has_tokenizer(spec: DrafterSpec) -> bool:
    """Whether the drafter's folder carries a tokenizer of its own."""
    return any((spec.path / name).is_file() for name in TOKENIZER_FILES)
