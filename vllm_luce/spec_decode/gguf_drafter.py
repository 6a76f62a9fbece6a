"""DFlash drafters as GGUF files in Lucebox's layout (pure: ``gguf``, ``safetensors``, torch; no vLLM).

The layout (learned from Lucebox's converters, written here from scratch):

* architecture ``qwen35-dflash-draft`` (full-attention drafters) or ``gemma4-dflash-draft``
  (drafters with sliding-window layers);
* keys ``{arch}.embedding_length``, ``.block_count``, ``.feed_forward_length``,
  ``.attention.head_count``, ``.attention.head_count_kv``, ``.attention.key_length``,
  ``.attention.value_length``, ``.vocab_size``, ``.context_length``,
  ``.attention.layer_norm_rms_epsilon``, ``.rope.freq_base``, ``.dflash.block_size``,
  ``.dflash.mask_token_id``, ``.dflash.n_target_layers``, ``.dflash.target_layer_ids``,
  ``.dflash.target_hidden``; with sliding-window layers also ``.attention.sliding_window``
  and ``.attention.sliding_window_pattern`` (one bool per layer);
* tensors ``dflash.fc.weight``, ``dflash.hidden_norm.weight``, ``output_norm.weight`` and per
  layer ``blk.{i}.attn_norm``, ``ffn_norm``, ``attn_q``, ``attn_k``, ``attn_v``,
  ``attn_output``, ``attn_q_norm``, ``attn_k_norm``, ``ffn_gate``, ``ffn_up``, ``ffn_down``;
  norms are F32, projections BF16, F16 or Q8_0.

``write_gguf`` reads the architecture from ``config.json`` and checks it against the tensor
shapes; nothing is tied to one model size. ``read_gguf`` gives back a z-lab ``config.json``
dict and safetensors state dict, which ``materialize`` writes where vLLM can load them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_TENSORS = {"fc.weight": "dflash.fc.weight", "hidden_norm.weight": "dflash.hidden_norm.weight",
               "norm.weight": "output_norm.weight"}
LINEAR_TYPES = ("bf16", "f16", "q8_0")
SLIDING = "sliding_attention"


class DrafterFormatError(ValueError):
    pass


def gguf_name(name: str) -> str:
    if name in TOP_TENSORS:
        return TOP_TENSORS[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() and parts[2] in LAYER_TENSORS:
        return f"blk.{parts[1]}.{LAYER_TENSORS[parts[2]]}"
    raise DrafterFormatError(f"tensor {name!r} is not part of a z-lab DFlash drafter")


def safetensors_name(name: str) -> str:
    for source, target in TOP_TENSORS.items():
        if name == target:
            return source
    parts = name.split(".", 2)
    inverse = {v: k for k, v in LAYER_TENSORS.items()}
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in inverse:
        return f"layers.{parts[1]}.{inverse[parts[2]]}"
    raise DrafterFormatError(f"GGUF tensor {name!r} is not part of a DFlash drafter")


def architecture(config: dict) -> dict:
    """The drafter's architecture from config.json (what the GGUF metadata records)."""
    dflash = config.get("dflash_config") or {}
    layer_types = config.get("layer_types") or ["full_attention"] * config["num_hidden_layers"]
    theta = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta"))
    arch = {
        "hidden": config["hidden_size"], "layers": config["num_hidden_layers"],
        "intermediate": config["intermediate_size"], "heads": config["num_attention_heads"],
        "kv_heads": config["num_key_value_heads"],
        "head_dim": config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
        "vocab": config["vocab_size"], "rms_eps": config["rms_norm_eps"], "rope_theta": float(theta),
        "context": config.get("max_position_embeddings", 32768),
        "block_size": config.get("block_size") or dflash.get("block_size"),
        "mask_token_id": dflash.get("mask_token_id", config.get("mask_token_id")),
        "target_layer_ids": list(dflash.get("target_layer_ids") or []),
        "target_hidden": config.get("target_hidden_size") or config["hidden_size"],
        "sliding": [t == SLIDING for t in layer_types],
        "sliding_window": config.get("sliding_window") or dflash.get("swa_window_size"),
    }
    missing = [k for k in ("block_size", "mask_token_id") if arch[k] is None]
    if missing or not arch["target_layer_ids"]:
        raise DrafterFormatError(f"config.json lacks {missing or ['dflash_config.target_layer_ids']}; "
                                 "is this a DFlash drafter?")
    if any(arch["sliding"]) and not arch["sliding_window"]:
        raise DrafterFormatError("config.json has sliding_attention layers but no sliding_window")
    return arch


def check_shapes(arch: dict, tensors: dict[str, torch.Tensor]) -> None:
    """Cross-check the architecture against the weights; a mismatch names both numbers."""
    h, hd = arch["hidden"], arch["head_dim"]
    expect = {"fc.weight": (h, len(arch["target_layer_ids"]) * arch["target_hidden"]),
              "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for i in range(arch["layers"]):
        p = f"layers.{i}."
        expect.update({p + "self_attn.q_proj.weight": (arch["heads"] * hd, h),
                       p + "self_attn.k_proj.weight": (arch["kv_heads"] * hd, h),
                       p + "self_attn.v_proj.weight": (arch["kv_heads"] * hd, h),
                       p + "self_attn.o_proj.weight": (h, arch["heads"] * hd),
                       p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                       p + "mlp.gate_proj.weight": (arch["intermediate"], h),
                       p + "mlp.up_proj.weight": (arch["intermediate"], h),
                       p + "mlp.down_proj.weight": (h, arch["intermediate"]),
                       p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
    missing = sorted(set(expect) - set(tensors))
    extra = sorted(set(tensors) - set(expect))
    wrong = [f"{k}: weights {tuple(tensors[k].shape)} vs config {v}" for k, v in expect.items()
             if k in tensors and tuple(tensors[k].shape) != v]
    if missing or extra or wrong:
        raise DrafterFormatError("drafter weights do not match its config.json: "
                                 + "; ".join(filter(None, [f"missing {missing}" if missing else "",
                                                           f"unexpected {extra}" if extra else "", *wrong])))


def write_gguf(drafter_dir: str | Path, out_path: str | Path, linear_type: str = "bf16") -> dict:
    import gguf
    from safetensors.torch import load_file

    if linear_type not in LINEAR_TYPES:
        raise DrafterFormatError(f"--linear-type {linear_type!r}; expected one of {', '.join(LINEAR_TYPES)}")
    drafter_dir = Path(drafter_dir)
    config = json.loads((drafter_dir / "config.json").read_text())
    arch = architecture(config)
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(drafter_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    check_shapes(arch, tensors)
    name = "gemma4-dflash-draft" if any(arch["sliding"]) else "qwen35-dflash-draft"
    writer = gguf.GGUFWriter(str(out_path), name)
    u32 = {"context_length": arch["context"], "embedding_length": arch["hidden"], "block_count": arch["layers"],
           "feed_forward_length": arch["intermediate"], "attention.head_count": arch["heads"],
           "attention.head_count_kv": arch["kv_heads"], "attention.key_length": arch["head_dim"],
           "attention.value_length": arch["head_dim"], "vocab_size": arch["vocab"],
           "dflash.block_size": arch["block_size"], "dflash.mask_token_id": arch["mask_token_id"],
           "dflash.n_target_layers": len(arch["target_layer_ids"]), "dflash.target_hidden": arch["target_hidden"]}
    for key, value in u32.items():
        writer.add_uint32(f"{name}.{key}", int(value))
    writer.add_float32(f"{name}.attention.layer_norm_rms_epsilon", float(arch["rms_eps"]))
    writer.add_float32(f"{name}.rope.freq_base", arch["rope_theta"])
    writer.add_array(f"{name}.dflash.target_layer_ids", [int(i) for i in arch["target_layer_ids"]])
    if any(arch["sliding"]):
        writer.add_uint32(f"{name}.attention.sliding_window", int(arch["sliding_window"]))
        writer.add_array(f"{name}.attention.sliding_window_pattern", [bool(s) for s in arch["sliding"]])
    writer.add_string("general.name", drafter_dir.name)
    for key in sorted(tensors, key=lambda k: gguf_name(k)):
        t = tensors[key].float()
        if t.dim() == 1:
            writer.add_tensor(gguf_name(key), t.numpy().astype(np.float32))
        elif linear_type == "q8_0":
            q = gguf.quants.quantize(t.numpy(), gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gguf_name(key), q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif linear_type == "f16":
            writer.add_tensor(gguf_name(key), t.numpy().astype(np.float16))
        else:  # bf16 bit patterns, lossless for bf16 checkpoints
            bits = t.to(torch.bfloat16).view(torch.int16).numpy()
            writer.add_tensor(gguf_name(key), bits, raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"architecture": name, "tensors": len(tensors), "linear_type": linear_type, **arch}


def _field(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        return None
    values = [field.parts[i] for i in field.data]
    flat = [v.tolist() if hasattr(v, "tolist") else v for v in values]
    flat = [x[0] if isinstance(x, list) and len(x) == 1 else x for x in flat]
    return flat if len(flat) != 1 or key.endswith(("target_layer_ids", "sliding_window_pattern")) else flat[0]


def read_gguf(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """A GGUF drafter as (z-lab config.json dict, safetensors state dict in bf16)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch_name = _field(reader, "general.architecture")
    if isinstance(arch_name, list):
        arch_name = bytes(arch_name).decode()
    elif isinstance(arch_name, (bytes, np.ndarray)):
        arch_name = bytes(arch_name).decode()
    if arch_name not in ("qwen35-dflash-draft", "gemma4-dflash-draft"):
        raise DrafterFormatError(f"{path}: GGUF architecture {arch_name!r} is not a DFlash drafter "
                                 "(expected qwen35-dflash-draft or gemma4-dflash-draft)")

    def get(key: str, required: bool = True):
        value = _field(reader, f"{arch_name}.{key}")
        if value is None and required:
            raise DrafterFormatError(f"{path}: missing GGUF key {arch_name}.{key}")
        return value

    layers = int(get("block_count"))
    pattern = get("attention.sliding_window_pattern", required=False)
    layer_types = ([SLIDING if s else "full_attention" for s in pattern] if pattern
                   else ["full_attention"] * layers)
    theta = float(get("rope.freq_base"))
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "dtype": "bfloat16",
        "hidden_size": int(get("embedding_length")), "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": layers, "num_attention_heads": int(get("attention.head_count")),
        "num_key_value_heads": int(get("attention.head_count_kv")), "head_dim": int(get("attention.key_length")),
        "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(get("context_length")), "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta}, "layer_types": layer_types,
        "tie_word_embeddings": False, "vocab_size": int(get("vocab_size")),
        "block_size": int(get("dflash.block_size")), "num_target_layers": int(get("dflash.n_target_layers")),
        "dflash_config": {"mask_token_id": int(get("dflash.mask_token_id")),
                          "target_layer_ids": [int(i) for i in get("dflash.target_layer_ids")]},
    }
    window = get("attention.sliding_window", required=False)
    if window is not None:
        config["sliding_window"] = int(window)
    target_hidden = get("dflash.target_hidden", required=False)
    if target_hidden is not None and int(target_hidden) != config["hidden_size"]:
        config["target_hidden_size"] = int(target_hidden)
    state = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF stores dims innermost first
        if t.tensor_type == gguf.GGMLQuantizationType.BF16:
            value = torch.from_numpy(np.array(t.data, copy=True).view(np.int16)).view(torch.bfloat16)
        else:
            value = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
        state[safetensors_name(t.name)] = value.reshape(shape).to(torch.bfloat16).contiguous()
    check_shapes(architecture(config), state)
    return config, state


def materialize(gguf_path: str | Path, cache_root: str | Path | None = None) -> Path:
    """A z-lab directory vLLM can load, converted once per GGUF content (cached by sha256)."""
    from safetensors.torch import save_file

    from vllm_luce.log import StartupStep

    gguf_path = Path(gguf_path)
    step = StartupStep(f"DFlash: preparing the GGUF drafter {gguf_path} for vLLM (a hash, then a conversion to "
                       "safetensors unless one is cached)", f"{gguf_path.stat().st_size / 2**30:.2f} GiB")
    digest = hashlib.sha256(gguf_path.read_bytes()).hexdigest()[:16]
    root = Path(cache_root or os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vllm-luce" / "drafters"
    out = root / f"{gguf_path.stem}-{digest}"
    if (out / "model.safetensors").is_file():
        step.done(f"DFlash: GGUF drafter ready at {out} (cached conversion)")
        return out
    config, state = read_gguf(gguf_path)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    if out.exists():  # another process converted it meanwhile
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, out)
    step.done(f"DFlash: GGUF drafter ready at {out} (converted now)")
    return out
