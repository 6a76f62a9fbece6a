"""Resolve `--speculative-model dflash` to a drafter directory (pure: no vLLM import).

Search order for the word ``dflash`` (the first hit wins):
  1. next to the target: ``TARGET/dflash/``, then ``TARGET/dflash.gguf``;
  2. a sibling of the target directory named ``<target-name>-DFlash*`` (a directory or a
     ``.gguf`` file; sorted, first);
  3. the ``VLLM_LUCE_DRAFTER`` environment variable (a drafter directory);
  4. the z-lab naming convention in the local Hugging Face cache:
     ``models--z-lab--<target-name>-DFlash*`` (the snapshot ``refs/main`` names, else the newest).
Anything other than ``dflash`` is a path or repository id and is returned as given.

A drafter is a directory whose ``config.json`` names ``DFlashDraftModel`` (z-lab's layout) or a
``.gguf`` file in Lucebox's layout (``gguf_drafter.py``), converted once into a cached z-lab
directory for vLLM.
When nothing is found, ``DrafterNotFound`` lists every place tried, in order.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

DFLASH_WORD = "dflash"
DRAFTER_ENV = "VLLM_LUCE_DRAFTER"
DFLASH_ARCHITECTURE = "DFlashDraftModel"


class DrafterNotFound(FileNotFoundError):
    pass


class DrafterMismatch(ValueError):
    pass


class DrafterWeightsError(ValueError):
    """A local drafter directory whose weights vLLM could not load safely (pickle-only, truncated)."""


@dataclass(frozen=True)
class ResolvedDrafter:
    path: str  # a local directory, or a repository id given as is
    source: str  # which rule found it, for the startup log


def target_name(target: str) -> str:
    """``Qwen/Qwen3-8B`` -> ``Qwen3-8B``; a local path -> its directory name; an HF cache snapshot
    (``.../models--Qwen--Qwen3-8B/snapshots/<rev>``) -> the repository's name."""
    path = Path(target.rstrip("/"))
    for part in reversed(path.parts):
        if part.startswith("models--"):
            return part.split("--")[-1]
    return path.name


def is_dflash_drafter(path: Path) -> bool:
    """A z-lab directory (config.json naming DFlashDraftModel) or a GGUF file (Lucebox layout)."""
    if path.suffix == ".gguf":
        return path.is_file()
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return DFLASH_ARCHITECTURE in (config.get("architectures") or [])


def hf_hub_cache(env: Mapping[str, str]) -> Path:
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    hf_home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                 "huggingface")
    return Path(hf_home) / "hub"


def _cached_snapshot(repo_dir: Path) -> Path | None:
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        snap = repo_dir / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    snaps = sorted((p for p in (repo_dir / "snapshots").glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return snaps[-1] if snaps else None


def resolve_drafter(spec: str, target: str, env: Mapping[str, str] | None = None) -> ResolvedDrafter:
    """The drafter for ``--speculative-model spec`` with target ``target`` (see the module doc)."""
    if spec != DFLASH_WORD:
        return ResolvedDrafter(spec, "given")
    env = os.environ if env is None else env
    tried: list[str] = []
    name = target_name(target)
    target_dir = Path(target).expanduser()

    if target_dir.is_dir():
        for beside in (target_dir / "dflash", target_dir / "dflash.gguf"):
            tried.append(f"{beside}{'/' if beside.suffix != '.gguf' else ''} (next to the target)")
            if is_dflash_drafter(beside):
                return ResolvedDrafter(str(beside), "next to the target")
        pattern = f"{target_dir.name}-DFlash*"
        tried.append(f"{target_dir.parent}/{pattern} (sibling of the target)")
        for sibling in sorted(target_dir.parent.glob(pattern)):
            if is_dflash_drafter(sibling):
                return ResolvedDrafter(str(sibling), "sibling of the target")
    else:
        tried.append(f"next to the target: {target} is not a local directory")

    from_env = env.get(DRAFTER_ENV, "")
    tried.append(f"${DRAFTER_ENV}" + (f" = {from_env}" if from_env else " (unset)"))
    if from_env:
        if not is_dflash_drafter(Path(from_env).expanduser()):
            raise DrafterNotFound(f"${DRAFTER_ENV} = {from_env} is not a DFlash drafter directory "
                                  f"(expected a config.json with architectures [{DFLASH_ARCHITECTURE!r}])")
        return ResolvedDrafter(str(Path(from_env).expanduser()), f"${DRAFTER_ENV}")

    cache = hf_hub_cache(env)
    pattern = f"models--z-lab--{name}-DFlash*"
    tried.append(f"{cache}/{pattern} (z-lab naming in the Hugging Face cache)")
    for repo_dir in sorted(cache.glob(pattern)):
        snap = _cached_snapshot(repo_dir)
        if snap is not None and is_dflash_drafter(snap):
            return ResolvedDrafter(str(snap), f"Hugging Face cache ({repo_dir.name})")

    places = "\n  ".join(f"{i}. {t}" for i, t in enumerate(tried, 1))
    raise DrafterNotFound(
        f"--speculative-model dflash: no DFlash drafter found for target {target!r}. Tried, in order:\n  "
        f"{places}\nPass a drafter path or repository id instead of 'dflash', or set ${DRAFTER_ENV}.")


def load_drafter_config(path: str) -> dict | None:
    """The drafter's config.json, or None for a repository id not on disk (vLLM downloads it)."""
    if path.endswith(".gguf"):
        raise ValueError(f"{path}: materialize a GGUF drafter before reading its config")
    try:
        return json.loads((Path(path) / "config.json").read_text())
    except OSError:
        return None


def check_drafter_weights(path: str, where: str = "--speculative-model") -> None:
    """A local drafter directory's weights must be complete safetensors: checked here, at startup,
    from the headers alone. vLLM would otherwise unpickle ``*.bin`` files when no safetensors exist,
    or fail inside a worker on a truncated file without naming it. A repository id, or a directory
    with no weight files at all (vLLM's own error names it), is left to vLLM."""
    root = Path(path)
    if not root.is_dir():
        return
    from vllm_luce.checkpoint_headers import PICKLE_SUFFIXES, DrafterError, read_headers  # pure: headers only

    if not any(root.glob("*.safetensors")) and not any(p.suffix in PICKLE_SUFFIXES for p in root.iterdir()):
        return
    try:
        read_headers(root, where)
    except DrafterError as e:
        raise DrafterWeightsError(str(e)) from None


def default_num_speculative_tokens(drafter_config: dict, path: str | None = None) -> int:
    """A block of B slots is [last token, mask x (B - 1)]: B - 1 drafted tokens per step."""
    block = drafter_config.get("block_size") or (drafter_config.get("dflash_config") or {}).get("block_size")
    if not isinstance(block, int) or block < 2:
        where = f"DFlash drafter {path}: config.json" if path else "DFlash drafter config"
        raise DrafterMismatch(f"{where} has block_size {block!r}; expected an integer >= 2")
    return block - 1


def _rope_theta(config: dict) -> float | None:
    """RoPE base of the full-attention layers (flat, or nested per layer type as in Gemma 4)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]
    theta = params.get("rope_theta", config.get("rope_theta"))
    return float(theta) if theta is not None else None


def check_drafter_matches_target(drafter: dict, target: dict, drafter_path: str, target_path: str) -> None:
    """Stop startup when a drafter cannot belong to this target; names both values.

    ``target`` is the target's text config (``hf_text_config`` as a dict)."""
    problems = []
    layer_count = target.get("num_hidden_layers")
    if drafter.get("vocab_size") != target.get("vocab_size"):
        problems.append(f"vocab_size: drafter {drafter.get('vocab_size')} vs target {target.get('vocab_size')}")
    ids = (drafter.get("dflash_config") or {}).get("target_layer_ids")
    if ids is None:
        problems.append("dflash_config.target_layer_ids: missing in the drafter config")
    else:
        # id i means "output of target layer i": vLLM captures it after layer i runs (as aux layer
        # i + 1, the input of the next layer, or after the last one), so ids run 0..L-1.
        bad = [i for i in ids if not isinstance(i, int) or i < 0 or i > layer_count - 1]
        if bad:
            problems.append(f"dflash_config.target_layer_ids: drafter {ids} has {bad} outside 0..{layer_count - 1} "
                            f"(target has num_hidden_layers {layer_count}; id i is the output of layer i)")
    if drafter.get("hidden_size") != target.get("hidden_size"):  # it reads the target's embeddings and lm_head
        problems.append(f"hidden_size: drafter {drafter.get('hidden_size')} vs target {target.get('hidden_size')}")
    d_theta, t_theta = _rope_theta(drafter), _rope_theta(target)
    if d_theta is not None and t_theta is not None and d_theta != t_theta:
        problems.append(f"rope_theta: drafter {d_theta:g} vs target {t_theta:g}")
    if problems:
        raise DrafterMismatch(f"DFlash drafter {drafter_path} does not match target {target_path}:\n  - "
                              + "\n  - ".join(problems))
