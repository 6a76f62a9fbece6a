"""Convert a DFlash drafter (z-lab safetensors) to GGUF and check it drafts what the original drafts.

    python examples/convert_drafter.py [--drafter DIR] [--target DIR] [--out FILE.gguf]

1. `vllm-luce convert-drafter DRAFTER_DIR OUT.gguf` writes the GGUF (Lucebox's layout).
2. The same target runs greedy generation twice through the offline `vllm.LLM` API, first with the
   safetensors drafter, then with the GGUF (`speculative_config={"model": "OUT.gguf"}`; `vllm serve`
   takes `--speculative-model OUT.gguf`, or finds `<target>-DFlash.gguf` beside the target with
   `--speculative-model dflash`). The method (dflash) and the draft count (block size - 1) come from
   the drafter. vllm-luce's gate is off here so that every draft is verified: equal accepted counts
   at every draft position and equal outputs show the GGUF drafter drafts the same tokens.

The defaults are the trained test models in `tests/assets/trained`.
"""

import argparse
import gc
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# One process (engines start faster) and vLLM CPU backend settings, harmless on a GPU.
for key, value in {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
                   "VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1"}.items():
    os.environ.setdefault(key, value)

TRAINED = Path(__file__).resolve().parents[1] / "tests" / "assets" / "trained"


def code_prompts(path: Path, count: int = 3) -> list[str]:
    """Openings of held-out source files, each cut at the end of a line (without its newline)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    heads = [t[:600] for t in texts if len(t) > 2000][:count]
    return [h[: h.rfind("\n")] for h in heads]


def generate(target: Path, drafter: Path, prompts: list[str]) -> tuple[list[list[int]], list[str], list[int]]:
    """Greedy token ids and texts, and accepted draft tokens per draft position, with every draft verified."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(target), speculative_config={"model": str(drafter)}, max_model_len=1024,
              dtype="bfloat16", seed=0, enforce_eager=True, disable_log_stats=False,
              enable_prefix_caching=False,  # needed by hybrid (Gated DeltaNet) targets with DFlash on CPU
              additional_config={"luce": {"dflash": {"gate": False}}})
    outs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True), use_tqdm=False)
    per_pos = next(m.values for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos")
    del llm  # one engine at a time in a process
    gc.collect()
    return [list(o.outputs[0].token_ids) for o in outs], [o.outputs[0].text for o in outs], list(per_pos)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", type=Path, default=TRAINED / "qwen36-dflash", help="z-lab DFlash drafter directory")
    ap.add_argument("--target", type=Path, default=TRAINED / "qwen36-target")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "vllm-luce-example" / "drafter.gguf")
    ap.add_argument("--linear-type", default="bf16", choices=("bf16", "f16", "q8_0"))
    ap.add_argument("--prompts", type=Path, default=TRAINED / "heldout.jsonl.gz", help="code to complete (.jsonl.gz)")
    args = ap.parse_args()

    args.out.parent.mkdir(parents=True, exist_ok=True)
    cli = shutil.which("vllm-luce", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    command = [cli or "vllm-luce", "convert-drafter", str(args.drafter), str(args.out), "--linear-type",
               args.linear_type]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    size = sum(f.stat().st_size for f in args.drafter.glob("*.safetensors"))
    print(f"safetensors {size / 2**20:.1f} MiB -> GGUF {args.out.stat().st_size / 2**20:.1f} MiB")

    prompts = code_prompts(args.prompts)
    ids_st, texts, pos_st = generate(args.target, args.drafter, prompts)
    ids_gguf, _, pos_gguf = generate(args.target, args.out, prompts)
    for prompt, text in zip(prompts, texts):
        print(f"\n...{prompt.splitlines()[-1]!r} -> {text!r}")
    print(f"\naccepted drafts per position, safetensors drafter: {pos_st}")
    print(f"accepted drafts per position, GGUF drafter:        {pos_gguf}")
    same = ids_st == ids_gguf and pos_st == pos_gguf
    print(f"GGUF drafter matches the safetensors drafter: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
