"""Demo: `vllm serve` with vllm-luce on an embedded model, queried by the official openai client.

Default: the trained Qwen3.6-architecture test model (`tests/assets/trained`, 6.7 M parameters:
Gated DeltaNet + gated full attention) with its DFlash drafter beside it, served as users will
type it: `vllm serve TARGET --speculative-model dflash`. `examples/serve_openai_client.py` queries it
(a code completion, the same prompt opted out of PFlash, a chat completion, vllm-luce's counters);
then it prints vLLM's speculative-decoding counters and what vllm-luce reported in each vLLM process
(the drafter found, the gate on), and stops the server.
`--all-features` also serves with KVFlash and PFlash (the trained scorer) and sends a 2K-token prompt,
which PFlash compresses. `--tiny FAMILY` serves a tiny random-weight checkpoint of that family
instead (text is noise; the point is the path). Run through `bash scripts/demo.sh`.
"""

import argparse
import json
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import serve_openai_client  # noqa: E402
from fixtures.server import Server  # noqa: E402
from fixtures.tiny_models import build_model  # noqa: E402
from fixtures.trained import heldout_files, served_pair, trained_model  # noqa: E402


def code_prompt(chars: int) -> str:
    """The opening of held-out source (never trained on), cut at a line end (without its newline)."""
    text = "".join(f["text"] for f in heldout_files() if len(f["text"]) > 2000)[:chars]
    return text[: text.rfind("\n")]


def spec_counters(base_url: str) -> str:
    text = urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=10).read().decode()
    values = {}
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        match = re.search(rf"^vllm:spec_decode_{name}_total\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
        values[name] = float(match.group(1)) if match else 0.0
    if not values["num_drafts"]:
        return "no drafts verified (the gate chose plain decoding)"
    mean = 1 + values["num_accepted_tokens"] / values["num_drafts"]
    return (f"{values['num_drafts']:.0f} drafts verified, {values['num_draft_tokens']:.0f} draft tokens, "
            f"mean acceptance length {mean:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", metavar="FAMILY", help="serve a tiny random checkpoint (e.g. qwen3_6) instead")
    parser.add_argument("--all-features", action="store_true", help="also KVFlash and PFlash (trained model only)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "vllm-luce-demo")
    args = parser.parse_args()

    start = time.time()
    if args.tiny:
        model, extra = build_model(args.tiny, args.workdir / args.tiny), ()
        print(f"model: tiny {args.tiny} checkpoint at {model}")
    else:
        model = served_pair(args.workdir)
        extra = ("--speculative-model", "dflash", "--no-enable-prefix-caching", "--dtype", "bfloat16")
        if args.all_features:
            luce = {"kvflash": {"pool_tokens": 1024},
                    "pflash": {"drafter": str(trained_model("scorer")), "keep_ratio": 0.2, "min_prompt_tokens": 512}}
            extra += ("--max-model-len", "4096", "--additional-config", json.dumps({"luce": luce}))
        print(f"model: trained Qwen3.6-architecture target at {model}, DFlash drafter beside it")
    with Server(model, args.workdir / "serve.log", *extra) as server:
        print(f"server: vllm serve {' '.join(extra)} healthy at {server.base_url} after {time.time() - start:.1f}s")
        prompt_file = args.workdir / "prompt.txt"
        prompt_file.write_text(code_prompt(6000 if args.all_features else 700))
        serve_openai_client.main(["--base-url", server.base_url, "--model", server.served_name,
                                  "--prompt-file", str(prompt_file)])
        if not args.tiny:
            print(f"speculative decoding: {spec_counters(server.base_url)}")
        print("vllm-luce, as logged by each vLLM process:")
        for line in server.log_text().splitlines():
            match = re.search(r"(vllm-luce [\d.]+ \[.*)", line)
            if match:
                print(f"  {match.group(1)}")
    print(f"done in {time.time() - start:.1f}s (server stopped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
