"""A drafter checkpoint's safetensors headers, read and checked without loading its weights (no vLLM import): PFlash's
drafter spec (``pflash/drafter_spec.py``) and DFlash's drafter check (``spec_decode/resolve.py``) both read them.
Pickle checkpoints (``*.bin``, ``*.pt``) are never read.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")  # pickle checkpoints: never read


class DrafterError(ValueError):
    """A drafter that cannot be used; the message names the setting, file and values."""


def read_headers(root: Path, where: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (file, shape) over the directory's safetensors files, checking each file's size."""
    files = sorted(root.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in root.iterdir() if p.suffix in PICKLE_SUFFIXES)
        hint = f" (found {', '.join(pickles)}: pickle checkpoints are never loaded)" if pickles else ""
        raise DrafterError(f"{where}: {root} has no *.safetensors weights{hint}")
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for f in files:
        size = f.stat().st_size
        with f.open("rb") as fh:
            raw = fh.read(8)
            n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            if n <= 0 or 8 + n > size:
                raise DrafterError(f"{where}: {f} is not a complete safetensors file (header length {n}, "
                                   f"file size {size})")
            try:
                header = json.loads(fh.read(n))
            except ValueError:
                raise DrafterError(f"{where}: {f} has a corrupt safetensors header") from None
        if not isinstance(header, dict):
            raise DrafterError(f"{where}: {f} has a safetensors header that is a JSON {type(header).__name__}; "
                               "expected an object of tensor name -> {dtype, shape, data_offsets}")
        end = 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            shape, offsets = _tensor_entry(f, name, info, where)
            out[name] = (f.name, shape)
            end = max(end, offsets[1])
        if 8 + n + end > size:
            raise DrafterError(f"{where}: {f} is truncated: its header describes {8 + n + end} bytes, "
                               f"the file has {size}")
    return out


def _tensor_entry(f: Path, name: str, info: object, where: str) -> tuple[tuple[int, ...], tuple[int, int]]:
    """A header entry's shape and data offsets, or a DrafterError naming the file, the tensor and what was expected."""
    def is_count(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    shape = info.get("shape") if isinstance(info, dict) else None
    offsets = info.get("data_offsets") if isinstance(info, dict) else None
    if not (isinstance(shape, list) and all(is_count(d) for d in shape)
            and isinstance(offsets, list) and len(offsets) == 2 and all(is_count(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise DrafterError(f"{where}: {f} has a malformed safetensors header entry for tensor {name!r}: got "
                           f"{json.dumps(info)[:200]}; expected an object with \"shape\" (a list of integers >= 0) "
                           "and \"data_offsets\" ([begin, end], integers, begin <= end)")
    return tuple(shape), (offsets[0], offsets[1])
