"""`vllm-luce check` and `vllm-luce info`: a configuration validated and resolved without vLLM running (model
directories hold a config.json only, or the committed trained pair), and the same errors `vllm serve` stops with."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from fixtures.tiny_models import FAMILY_SPECS, family_config
from fixtures.trained import trained_model
from vllm_luce import dry_run
from vllm_luce.cli import main as cli

MiB = 2**20


@pytest.fixture(autouse=True)
def no_luce_environment(monkeypatch, tmp_path):
    """No VLLM_LUCE_* variable of the shell reaches a test; the Hugging Face cache is empty."""
    for name in list(os.environ):
        if name.startswith("VLLM_LUCE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def model_dir(tmp_path, family: str = "qwen3_6", name: str = "target", **overrides) -> str:
    """A tiny model's config.json (as ``fixtures/tiny_models.py`` describes the family) and no weights."""
    out = tmp_path / name
    out.mkdir()
    config = {"architectures": [FAMILY_SPECS[family][1]], "dtype": "bfloat16", **family_config(family, **overrides)}
    (out / "config.json").write_text(json.dumps(config))
    return str(out)


def luce(tmp_path, **sections) -> str:
    """--additional-config with the host ledger in the test's folder (no other server's budget shows)."""
    if "kvflash" in sections:
        sections["kvflash"] = {"host_ledger": str(tmp_path / "ledger"), **sections["kvflash"]}
    return json.dumps({"luce": sections})


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli(["check", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


# family -> (executor, one chunk on one worker: full-attention layers x 64 tokens x KV heads x K and V x head dim
# x 2 bytes)
FAMILIES = {
    "qwen3_6": ("LuceQwen3_5ForCausalLM", 1 * 64 * 1 * 2 * 64 * 2),
    "gemma4": ("LuceGemma4ForCausalLM", 1 * 64 * 1 * 2 * 128 * 2),  # full layers use global_head_dim 128
    "laguna": ("LuceLagunaForCausalLM", 1 * 64 * 1 * 2 * 64 * 2),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_check_prints_every_resolved_kvflash_value(tmp_path, capsys, family):
    executor, chunk = FAMILIES[family]
    config = luce(tmp_path, kvflash={"pool_tokens": 1024, "host_bytes": 8 * MiB})
    code, out, err = run(capsys, model_dir(tmp_path, family), "--additional-config", config)
    assert (code, err) == (0, "")
    longest = (4096 - 1024) // 64 * chunk  # max_position_embeddings 4096: 48 chunks beyond the pool
    for line in (f"vllm-luce executor {executor}", "max_model_len: 4096 (config.json max_position_embeddings)",
                 "dflash: off (no --speculative-model)", "pflash: off",
                 "kvflash: on, selection page, policy salient",
                 "pool_tokens: 1024: 16 chunks of 64 tokens, 1 sink and 4 recent chunks",
                 "step budget: at most 832 tokens", f"one chunk: about {dry_run.size(chunk)} on each of the 1 workers",
                 "host_bytes: 8.0 MiB (8388608 bytes)", f"host_ledger: {tmp_path / 'ledger'}",
                 "host_request_bytes: auto: about 2.0 MiB (2097152 bytes) per request, split between the n samples of "
                 "one (max_model_len fits)",
                 f"host_pinned_bytes: auto: about {dry_run.size(longest)} pinned by each worker",
                 "vLLM 0.", "OK: vllm-luce's startup checks pass"):
        assert line in out, f"{line!r} missing from:\n{out}"


def test_check_resolves_auto_host_budget_and_a_request_share_below_max_model_len(tmp_path, capsys, monkeypatch):
    from vllm_luce.kvflash import host_ledger

    monkeypatch.setattr(host_ledger, "auto_budget", lambda: 8 * MiB)  # half of MemAvailable, as the server reads it
    monkeypatch.setattr(host_ledger, "sharing_unknown", lambda: False)
    config = luce(tmp_path, kvflash={"pool_tokens": 1024, "host_request_bytes": 64 * 1024})
    code, out, _ = run(capsys, model_dir(tmp_path), "--additional-config", config, "--max-model-len", 100_000,
                       "--tensor-parallel-size", 2)
    assert code == 0
    assert "host_bytes: auto: 8.0 MiB (8388608 bytes), half of the memory available now" in out
    # 64 KiB a request at 32 KiB a chunk for the engine's 2 workers: 2 host chunks beyond the 16 of the pool
    assert "a prompt beyond about 1152 tokens is refused" in out
    assert "max_model_len: 100000 (--max-model-len)" in out and "tensor_parallel_size: 2" in out
    monkeypatch.setattr(host_ledger, "sharing_unknown", lambda: True)  # a container with no memory limit
    code, out, _ = run(capsys, str(tmp_path / "target"), "--additional-config", config)
    assert code == 0 and "a quarter of the memory available now (a container with no memory limit" in out


def test_check_finds_the_dflash_drafter_and_checks_the_pflash_scorer(tmp_path, capsys):
    target = tmp_path / "qwen36-target"
    target.mkdir()
    shutil.copy(trained_model("qwen36-target") / "config.json", target)
    (tmp_path / "qwen36-target-DFlash").symlink_to(trained_model("qwen36-dflash"))
    config = luce(tmp_path, kvflash={"pool_tokens": 512}, pflash={"drafter": str(trained_model("scorer"))})
    code, out, err = run(capsys, target, "--speculative-model", "dflash", "--additional-config", config)
    assert (code, err) == (0, ""), err
    for line in (f"dflash: drafter {tmp_path / 'qwen36-target-DFlash'} (sibling of the target)",
                 "draft tokens per step: 15 (the drafter's block size - 1)", "gate: on",
                 "pflash: on", "scorer: drafter scorer (Qwen3ForCausalLM, 4 layers, 4 scored)", "keep 0.05",
                 "scorer attention auto (block-sparse on CUDA, dense elsewhere)"):
        assert line in out, f"{line!r} missing from:\n{out}"


def test_check_reports_the_gate_off_and_given_draft_tokens(tmp_path, capsys):
    target = model_dir(tmp_path)
    shutil.copytree(trained_model("qwen36-dflash"), tmp_path / "drafter")
    code, _, err = run(capsys, target, "--speculative-model", tmp_path / "drafter")
    assert code == 1 and "does not match target" in err  # the trained drafter belongs to the trained target
    code, out, _ = run(capsys, trained_model("qwen36-target"), "--speculative-model", tmp_path / "drafter",
                       "--spec-tokens", 4, "--additional-config", luce(tmp_path, dflash={"gate": False}))
    assert code == 0 and "draft tokens per step: 4 (--spec-tokens)" in out and "gate: off" in out


@pytest.mark.parametrize("sections, env, expected", [
    ({"kvflash": {"pool_tokns": 1024}}, {},
     "luce.kvflash.pool_tokns: unknown key 'pool_tokns'; accepted keys for kvflash: enabled, pool_tokens"),
    ({"kvflash": {"pool_tokens": "lots"}}, {}, "luce.kvflash.pool_tokens: got 'lots'; expected a positive integer"),
    ({"kvflash": {"pool_tokens": 128}}, {}, "luce.kvflash.pool_tokens: got 128; expected at least 384"),
    ({"kvflash": {"policy": "scorer"}}, {}, "luce.kvflash.policy: got 'scorer'"),
    ({"pflash": True}, {}, "luce.pflash.drafter: required"),
    ({"pflash": {"drafter": "/nowhere"}}, {}, "luce.pflash.drafter: '/nowhere' is not a directory with a config.json"),
    ({}, {"VLLM_LUCE_KVFLASH_POOL_TOKEN": "4096"}, "VLLM_LUCE_KVFLASH_POOL_TOKEN: unknown key 'pool_token'"),
    ({}, {"VLLM_LUCE_KVFLAH": "1"}, "unknown environment variable VLLM_LUCE_KVFLAH; accepted: VLLM_LUCE_DFLASH"),
    ({}, {"VLLM_LUCE_KVFLASH_CHUNK_TOKENS": "100"}, "VLLM_LUCE_KVFLASH_CHUNK_TOKENS: got 100; expected a power of two"),
    ({"kvflash": {}}, {"VLLM_LUCE_EXECUTORS": "off"}, "luce.kvflash: VLLM_LUCE_EXECUTORS=off serves the model"),
])
def test_check_stops_where_the_server_would(tmp_path, capsys, monkeypatch, sections, env, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = run(capsys, model_dir(tmp_path), "--additional-config", luce(tmp_path, **sections))
    assert (code, out) == (1, "")
    assert err.startswith("vllm-luce check: ") and expected in err, err


def test_check_refuses_kvflash_on_an_architecture_without_an_executor(tmp_path, capsys):
    plain = model_dir(tmp_path, "qwen3")
    code, out, _ = run(capsys, plain)
    assert code == 0 and "architecture Qwen3ForCausalLM: vLLM's own class (no vllm-luce executor; KVFlash refuses it)" \
        in out
    code, _, err = run(capsys, plain, "--additional-config", luce(tmp_path, kvflash={}))
    assert code == 1
    assert "luce.kvflash: the model's architecture Qwen3ForCausalLM is not served by a vllm-luce executor" in err


def test_check_names_every_place_it_looked_for_a_dflash_drafter(tmp_path, capsys):
    code, _, err = run(capsys, model_dir(tmp_path), "--speculative-model", "dflash")
    assert code == 1
    assert "--speculative-model dflash: no DFlash drafter found" in err and "$VLLM_LUCE_DRAFTER (unset)" in err


@pytest.mark.parametrize("argv, expected", [
    (["--additional-config", '{"luce": {'], "argument --additional-config: not valid JSON"),
    (["--additional-config", "[1]"], "argument --additional-config: got '[1]'; expected a JSON object"),
    (["--max-model-len", "0"], "argument --max-model-len: got '0'; expected an integer >= 1"),
])
def test_check_flags_are_read_as_vllm_serve_reads_them(tmp_path, capsys, argv, expected):
    with pytest.raises(SystemExit) as stopped:
        cli(["check", model_dir(tmp_path), *argv])
    assert stopped.value.code == 2 and expected in capsys.readouterr().err


def test_check_needs_the_model_config(tmp_path, capsys):
    code, _, err = run(capsys, tmp_path)
    assert code == 1 and f"MODEL {tmp_path}: no config.json" in err
    code, _, err = run(capsys, "nobody/nothing")
    assert code == 1 and "not a local directory and not in the Hugging Face cache" in err


def test_check_stops_on_an_unsupported_vllm_unless_told_to_run_anyway(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(dry_run, "installed_vllm_version", lambda: "0.27.1")
    code, _, err = run(capsys, model_dir(tmp_path))
    assert code == 1 and "but vLLM 0.27.1 is installed" in err
    monkeypatch.setenv("VLLM_LUCE_SKIP_VERSION_CHECK", "1")
    code, out, _ = run(capsys, tmp_path / "target")
    assert code == 0 and "vLLM 0.27.1: NOT SUPPORTED, run anyway" in out


@pytest.mark.parametrize("name, value, expected", [
    ("VLLM_LUCE_KVFLASH_POOL_TOKEN", "4096",
     "unknown key 'pool_token'; accepted keys for kvflash: enabled, pool_tokens"),
    ("VLLM_LUCE_PFLASH_KEEP_RATIO", "2", "VLLM_LUCE_PFLASH_KEEP_RATIO: got 2; expected a number in (0, 1]"),
    ("VLLM_LUCE_KVFLAH", "1", "unknown environment variable VLLM_LUCE_KVFLAH; accepted: VLLM_LUCE_DFLASH[_<KEY>]"),
    ("VLLM_LUCE_EXECUTORS", "of", "VLLM_LUCE_EXECUTORS='of'; expected one of auto, off"),
])
def test_info_fails_on_a_variable_that_stops_vllm_serve(capsys, monkeypatch, name, value, expected):
    monkeypatch.setenv(name, value)
    assert cli(["info"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("vllm-luce info: ") and expected in err


def test_info_passes_with_good_variables(capsys, monkeypatch):
    monkeypatch.setenv("VLLM_LUCE_KVFLASH_POOL_TOKENS", "4096")
    monkeypatch.setenv("VLLM_LUCE_SKIP_VERSION_CHECK", "1")
    assert cli(["info"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "executors: auto" in out and "pool_tokens = 'auto'" in out
