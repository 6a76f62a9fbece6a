"""Demo: `vllm serve` with vllm-luce on an embedded model, queried by the official openai client.

Default: the trained Qwen3.6-architecture test model (`tests/assets/trained`, 6.7 M parameters:
Gated DeltaNet + gated full attention) with its DFlash drafter beside it, served as users will
type it: `vllm serve TARGET --speculative-model dflash`. It sends a code completion and a chat
completion, prints the replies, vLLM's speculative-decoding counters and what vllm-luce reported in
each vLLM process (the drafter found, the gate on), then stops the server.
`--tiny FAMILY` serves a tiny random-weight checkpoint of that family instead (text is noise;
the point is the path). Run through `bash scripts/demo.sh`.
"""

import argparse
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.server import Server  # noqa: E402
from tests.fixtures.tiny_models import build_model  # noqa: E402
from tests.fixtures.trained import heldout_files, trained_model  # noqa: E402


def code_prompt() -> str:
    """The opening of a held-out source file (never trained on), cut at a line end."""
    text = next(f["text"] for f in heldout_files() if len(f["text"]) > 2000)[:700]
    return text[: text.rfind("\n") + 1]


def trained_layout(workdir: Path) -> Path:
    """models/qwen36-target and its sibling models/qwen36-target-DFlash: how users keep a pair."""
    models = workdir / "models"
    models.mkdir(parents=True, exist_ok=True)
    for name, asset in (("qwen36-target", "qwen36-target"), ("qwen36-target-DFlash", "qwen36-dflash")):
        link = models / name
        if not link.exists():
            link.symlink_to(trained_model(asset), target_is_directory=True)
    return models / "qwen36-target"


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
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "vllm-luce-demo")
    args = parser.parse_args()

    from openai import OpenAI

    start = time.time()
    if args.tiny:
        model, extra = build_model(args.tiny, args.workdir / args.tiny), ()
        print(f"model: tiny {args.tiny} checkpoint at {model}")
    else:
        model = trained_layout(args.workdir)
        extra = ("--speculative-model", "dflash", "--no-enable-prefix-caching", "--dtype", "bfloat16")
        print(f"model: trained Qwen3.6-architecture target at {model}, DFlash drafter beside it")
    with Server(model, args.workdir / "serve.log", *extra) as server:
        print(f"server: vllm serve {' '.join(extra)} healthy at {server.base_url} after {time.time() - start:.1f}s")
        client = OpenAI(base_url=server.base_url, api_key="unused")
        prompt = code_prompt()
        completion = client.completions.create(model=server.served_name, prompt=prompt, max_tokens=64,
                                               temperature=0)
        print(f"prompt (held-out code, last lines):\n{''.join(prompt.splitlines(True)[-4:])}")
        print(f"completion ({completion.usage.completion_tokens} tokens):\n{completion.choices[0].text}\n")
        chat = client.chat.completions.create(model=server.served_name, max_tokens=24, temperature=0,
                                              messages=[{"role": "user", "content": "Say hello."}])
        print(f"chat: {chat.choices[0].message.content!r}")
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
