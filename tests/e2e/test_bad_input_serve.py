"""Bad input through `vllm serve` (rows of docs/bad_input.md that need real vLLM).

One server for the module, with DFlash, KVFlash and PFlash all on and a pickle that would create a
marker file when unpickled next to the safetensors of the target, the DFlash drafter and the PFlash
drafter: prompts beyond max_model_len get vLLM's HTTP 400 and the server answers the next request;
no pickle is ever unpickled. Startup failures each run `vllm serve` in a subprocess (10-20 s, mostly
importing vLLM), all started together with the shared server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from fixtures.server import SERVE_ENV, Server, vllm_command
from fixtures.trained import heldout_files, trained_model
from tests.test_bad_input import write_bait

pytestmark = pytest.mark.e2e

MAX_LEN = 2048
TOO_LONG = "This model's maximum context length is 2048 tokens. However, your prompt contains"
BAITED = ("target", "dflash", "scorer")  # directory -> its bait's marker is markers/<name>


def _copy_with_bait(source, dest, marker):
    """``source``'s files (symlinked) plus a pytorch_model.bin pickle that creates ``marker`` if loaded."""
    dest.mkdir()
    for f in source.iterdir():
        (dest / f.name).symlink_to(f)
    write_bait(dest / "pytorch_model.bin", marker)
    return dest


def _truncated_drafter(root):
    drafter = shutil.copytree(trained_model("qwen36-dflash"), root / "truncated-drafter")
    f = drafter / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    return f


def _startup_cases(root):
    """case -> (extra `vllm serve` arguments, exit status, what the output says)."""
    missing, truncated = root / "no-such-drafter", _truncated_drafter(root)
    return {
        "malformed-json": (["--additional-config", '{"luce": {"kvflash": {"pool_tokens": 4096'], 2,
                           "vllm serve: error: argument --additional-config: not valid JSON (Expecting ',' delimiter"),
        "missing-drafter": (["--speculative-model", str(missing)], 1,
                            f"Invalid repository ID or local directory specified: '{missing}'"),
        "truncated-drafter": (["--speculative-model", str(truncated.parent)], 1,
                              f"DrafterWeightsError: --speculative-model: {truncated} is truncated: "
                              "its header describes"),
    }


@pytest.fixture(scope="module")
def failed_starts(tmp_path_factory):
    """Each bad-startup case as its own `vllm serve` subprocess, all started at once: they spend most of
    their 10-20 s importing vLLM, so they overlap each other and the shared server's startup."""
    root = tmp_path_factory.mktemp("bad-startup")
    running = {}
    for case, (args, status, expected) in _startup_cases(root).items():
        log = open(root / f"{case}.log", "w")
        proc = subprocess.Popen([*vllm_command(), str(trained_model("qwen36-target")), "--host", "127.0.0.1",
                                 "--port", "1", "--max-model-len", "512", "--no-enable-prefix-caching", *args],
                                stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **SERVE_ENV),
                                start_new_session=True)
        running[case] = (proc, log, status, expected)
    yield running
    for proc, log, _, _ in running.values():
        if proc.poll() is None:  # a case that did not stop: end it and whatever it started
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory, failed_starts):
    root = tmp_path_factory.mktemp("bad-input")
    markers = root / "markers"
    markers.mkdir()
    dirs = {name: _copy_with_bait(trained_model(source), root / name, markers / name)
            for name, source in zip(BAITED, ("qwen36-target", "qwen36-dflash", "scorer"))}
    luce = {"kvflash": {"pool_tokens": 1024},
            "pflash": {"drafter": str(dirs["scorer"]), "keep_ratio": 0.2, "min_prompt_tokens": 512}}
    with Server(dirs["target"], root / "serve.log", "--max-model-len", str(MAX_LEN), "--no-enable-prefix-caching",
                "--dtype", "bfloat16", "--speculative-model", str(dirs["dflash"]),
                "--additional-config", json.dumps({"luce": luce})) as server:
        server.dirs, server.markers = dirs, markers
        yield server


@pytest.fixture(scope="module")
def client(served):
    from openai import OpenAI

    return OpenAI(base_url=served.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def token_ids():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(trained_model("tokenizer")))
    ids = tok.encode("\n".join(f["text"] for f in heldout_files()[:40]), add_special_tokens=False)
    assert len(ids) > 2 * MAX_LEN
    return tok, ids


def test_prompt_beyond_max_model_len_is_a_400_and_the_server_stays_up(served, client, token_ids):
    import openai

    tok, ids = token_ids
    over = ids[:MAX_LEN + 600]
    attempts = {
        "completion, token ids": (lambda: client.completions.create(model="tiny", prompt=over, max_tokens=4), TOO_LONG),
        "completion, text": (lambda: client.completions.create(model="tiny", prompt=tok.decode(over), max_tokens=4),
                             TOO_LONG),
        "chat": (lambda: client.chat.completions.create(model="tiny", max_tokens=4,
                                                        messages=[{"role": "user", "content": tok.decode(over)}]),
                 TOO_LONG),
        # Exactly max_model_len leaves no room to generate: max_tokens is clamped to 0, then refused.
        "exactly max_model_len": (lambda: client.completions.create(model="tiny", prompt=ids[:MAX_LEN], max_tokens=4),
                                  "max_tokens must be at least 1, got 0."),
        "luce_dflash neither on nor off": (
            lambda: client.completions.create(model="tiny", prompt="def f():", max_tokens=4,
                                              extra_body={"vllm_xargs": {"luce_dflash": "of"}}),
            "vllm_xargs.luce_dflash: got 'of'; expected \"on\" or \"off\""),
        "luce_pflash neither on nor off": (
            lambda: client.chat.completions.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "Hi"}],
                                                   extra_body={"vllm_xargs": {"luce_pflash": "disable"}}),
            "vllm_xargs.luce_pflash: got 'disable'"),
    }
    for name, (attempt, expected) in attempts.items():
        with pytest.raises(openai.BadRequestError) as err:
            attempt()
        assert err.value.status_code == 400 and expected in str(err.value), (name, str(err.value))
    # The next requests are answered: a long prompt PFlash compresses, and a short one.
    long_ids = ids[:1500]
    reply = client.completions.create(model="tiny", prompt=long_ids, max_tokens=8, temperature=0)
    assert reply.choices[0].text and reply.usage.prompt_tokens < len(long_ids)  # PFlash kept a share
    chat = client.chat.completions.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert chat.usage.completion_tokens > 0
    with urllib.request.urlopen(served.base_url.removesuffix("/v1") + "/health", timeout=5) as health:
        assert health.status == 200
    assert served.proc.poll() is None
    assert "PFlash: request" in served.log_text()


def test_pickles_next_to_the_safetensors_are_never_unpickled(served, client):
    reply = client.completions.create(model="tiny", prompt="def main():\n", max_tokens=8, temperature=0)
    assert reply.choices[0].text
    for name in BAITED:
        assert (served.dirs[name] / "pytorch_model.bin").is_file()
    log = served.log_text()
    assert f"DFlash drafter {served.dirs['dflash']} (given)" in log, log[-3000:]
    assert "PFlash drafter scorer" in log and "kvflash(" in log and "pflash(" in log, log[-3000:]
    fired = sorted(p.name for p in served.markers.iterdir())
    assert fired == [], f"pickles were unpickled in: {fired}"


@pytest.mark.parametrize("case", ["malformed-json", "missing-drafter", "truncated-drafter"])
def test_bad_input_stops_vllm_serve(failed_starts, case):
    proc, log, status, expected = failed_starts[case]
    proc.wait(timeout=300)
    output = Path(log.name).read_text(errors="replace")
    assert proc.returncode == status, output[-3000:]
    assert expected in output, output[-3000:]
