"""Demo: `vllm serve` with vllm-luce on an embedded tiny model, queried by the official openai client.

Builds a tiny random-weight Qwen3.6-architecture checkpoint (Gated DeltaNet + full attention) locally,
starts `vllm serve` on 127.0.0.1, sends a completion and a chat completion, prints the replies and
what vllm-luce reported in each vLLM process, then stops the server. Random weights: the text is
noise; the point is the path (plugin, executor, server, client). Run through `bash scripts/demo.sh`.
"""

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.server import Server  # noqa: E402
from tests.fixtures.tiny_models import build_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="qwen3_6", help="tiny model family (default: qwen3_6)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "vllm-luce-demo")
    args = parser.parse_args()

    from openai import OpenAI

    start = time.time()
    model = build_model(args.family, args.workdir / args.family)
    print(f"model: tiny {args.family} checkpoint at {model} ({time.time() - start:.1f}s)")
    with Server(model, args.workdir / "serve.log") as server:
        print(f"server: vllm serve healthy at {server.base_url} after {time.time() - start:.1f}s")
        client = OpenAI(base_url=server.base_url, api_key="unused")
        completion = client.completions.create(model=server.served_name, prompt="def fibonacci(n):",
                                               max_tokens=24, temperature=0)
        print(f"completion: {completion.choices[0].text!r} ({completion.usage.completion_tokens} tokens)")
        chat = client.chat.completions.create(model=server.served_name, max_tokens=24, temperature=0,
                                              messages=[{"role": "user", "content": "Say hello."}])
        print(f"chat: {chat.choices[0].message.content!r}")
        print("vllm-luce, as logged by each vLLM process:")
        for line in server.log_text().splitlines():
            match = re.search(r"(vllm-luce [\d.]+ \[.*)", line)
            if match:
                print(f"  {match.group(1)}")
    print(f"done in {time.time() - start:.1f}s (server stopped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
