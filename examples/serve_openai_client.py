"""Query a running `vllm serve` (with vllm-luce) through the official `openai` client.

    vllm serve TARGET --speculative-model dflash \\
        --additional-config '{"luce": {"kvflash": {"pool_tokens": 4096}, "pflash": {"drafter": "/models/Qwen3-0.6B"}}}'
    python examples/serve_openai_client.py --base-url http://127.0.0.1:8000/v1 [--prompt-file long.txt]

Clients need nothing vllm-luce specific. Two optional details: a request can opt out of PFlash
(`extra_body={"vllm_xargs": {"luce_pflash": "off"}}`), and `usage.prompt_tokens` counts the tokens the
target prefilled, so the two completions below show PFlash's compression of a long prompt. Last, it
prints vllm-luce's non-zero counters from the server's `/metrics` (docs/metrics.md).
`examples/demo.py` starts a server on the embedded test model and runs this against it.
"""

import argparse
import re
import sys
import time
import urllib.request

# Prompts end inside a line: the embedded test model's tokenizer merges a newline with the next
# indent, so to that model a prompt ending with "\n" reads as the end of a file.
SNIPPET = "import os\n\n\ndef read_lines(path):\n    with open(path) as f:\n        return"


def luce_counters(base_url: str) -> list[str]:
    """vllm-luce's non-zero counters from `/metrics`, without the model_name label."""
    text = urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=10).read().decode()
    return [re.sub(r',?model_name="[^"]*"', "", line).replace("{,", "{").replace("{}", "")
            for line in text.splitlines()
            if line.startswith("vllm:luce_") and "_total" in line and not line.endswith(" 0.0")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", help="served model name (default: the server's first)")
    ap.add_argument("--prompt-file", help="a (long) prompt to complete; default: a short code snippet")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args(argv)

    from openai import OpenAI

    client = OpenAI(base_url=args.base_url, api_key="unused")
    model = args.model or client.models.list().data[0].id
    prompt = open(args.prompt_file).read() if args.prompt_file else SNIPPET

    completion = client.completions.create(model=model, prompt=prompt, max_tokens=args.max_tokens, temperature=0)
    print(f"prompt ends with: {prompt.splitlines()[-1]!r}")
    print(f"completion ({completion.usage.completion_tokens} tokens):\n{completion.choices[0].text}\n")
    full = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0,
                                     extra_body={"vllm_xargs": {"luce_pflash": "off"}})
    print(f"prompt tokens prefilled: {completion.usage.prompt_tokens} "
          f"(the same prompt opted out of PFlash: {full.usage.prompt_tokens})")

    chat = client.chat.completions.create(model=model, max_tokens=16, temperature=0,
                                          messages=[{"role": "user", "content": "Say hello."}])
    print(f"chat: {chat.choices[0].message.content!r}")

    time.sleep(1.5)  # the engine's and workers' values reach /metrics up to a second late
    print("vllm-luce counters:")
    for line in luce_counters(args.base_url):
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
