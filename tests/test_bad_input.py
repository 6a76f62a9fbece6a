"""Bad input, unit level: the rows of docs/bad_input.md that need no running engine, and a check that
every test the catalogue cites exists (so it cannot go stale). `tests/e2e/test_bad_input_serve.py`
has the rows that need `vllm serve`."""

from __future__ import annotations

import ast
import json
import pickle
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fixtures.trained import trained_model
from vllm_luce.config import SCHEMA, LuceConfig, LuceConfigError
from vllm_luce.patches.engine_args import apply_dflash_defaults
from vllm_luce.spec_decode import resolve as R

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = ROOT / "docs" / "bad_input.md"
NODE_ID = re.compile(r"`(tests/[\w/]+\.py)((?:::\w+)+)(\[[^`\]]*\])?`")


# --- the catalogue cites only tests that exist ------------------------------------------------

def _defined_names(path: Path) -> set[str]:
    """`func` and `Class::method` for every test function or method defined in ``path``."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{m.name}" for m in node.body
                      if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names


def catalogue_rows() -> list[str]:
    """The body rows of every table (not the header rows, not the `| --- |` rules under them)."""
    lines = CATALOGUE.read_text().splitlines()
    rule = lambda line: line.startswith("|") and set(line) <= set("|-: ")  # noqa: E731
    return [line for i, line in enumerate(lines) if line.startswith("|") and not rule(line)
            and not (i + 1 < len(lines) and rule(lines[i + 1]))]


def test_catalogue_cites_only_tests_that_exist():
    rows = catalogue_rows()
    assert len(rows) >= 20, f"{CATALOGUE}: expected the full table, found {len(rows)} rows"
    for row in rows:
        assert NODE_ID.findall(row), f"a row of {CATALOGUE.name} cites no test: {row}"
    missing = []
    for file, name, _params in NODE_ID.findall(CATALOGUE.read_text()):  # in the rows and in the prose
        path = ROOT / file
        if not path.is_file() or name[2:] not in _defined_names(path):
            missing.append(f"{file}{name}")
    assert not missing, f"{CATALOGUE.name} cites tests that do not exist: {missing}"


def test_the_catalogue_check_catches_a_stale_node_id(tmp_path, monkeypatch):
    """The check above fails for a renamed test (it is not vacuous)."""
    _file, name, _params = NODE_ID.findall(catalogue_rows()[0])[0]
    stale = CATALOGUE.read_text().replace(name, "::test_renamed_away")
    (tmp_path / "bad_input.md").write_text(stale)
    monkeypatch.setattr(sys.modules[__name__], "CATALOGUE", tmp_path / "bad_input.md")
    with pytest.raises(AssertionError, match="test_renamed_away"):
        test_catalogue_cites_only_tests_that_exist()


# --- pickle bait ----------------------------------------------------------------------------

class _Bait:
    """Unpickling it creates ``marker`` (what a malicious checkpoint could do instead)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def write_bait(path: Path, marker: Path) -> Path:
    path.write_bytes(pickle.dumps(_Bait(marker)))
    return path


def test_the_bait_fires_when_unpickled(tmp_path):
    bait = write_bait(tmp_path / "pytorch_model.bin", tmp_path / "fired")
    assert not (tmp_path / "fired").exists()
    pickle.loads(bait.read_bytes()).close()
    assert (tmp_path / "fired").exists()


# --- --additional-config that is not a JSON object ------------------------------------------

@pytest.fixture(scope="module")
def serve_parser():
    """vLLM's own engine-argument parser with vllm-luce's add_cli_args wrapper."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_luce.patches.engine_args import _make_add_cli_args

    return _make_add_cli_args(EngineArgs.add_cli_args)(FlexibleArgumentParser(prog="vllm serve"))


@pytest.mark.parametrize("value, message", [
    ('{"luce": {"kvflash": {"pool_tokens": 4096', "not valid JSON (Expecting ',' delimiter"),  # cut short
    ('{"luce": {"kvflash": {"pool_tokens": 4096}}', "not valid JSON (Expecting ',' delimiter"),
    ('{"luce": {kvflash: {}}}', "not valid JSON (Expecting property name enclosed in double quotes"),
    ("{'luce': {}}", "not valid JSON"),
    ('["luce"]', "got '[\"luce\"]'; expected a JSON object"),
    ("luce.kvflash.pool_tokens=4096", "not valid JSON"),
])
def test_malformed_additional_config_is_an_argument_error(serve_parser, capsys, value, message):
    with pytest.raises(SystemExit) as exit_:
        serve_parser.parse_args(["--additional-config", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --additional-config: {message}" in err and "expected a JSON object such as" in err, err


def test_well_formed_additional_config_still_parses(serve_parser):
    expected = {"luce": {"kvflash": {"pool_tokens": 4096}}}
    assert serve_parser.parse_args(["--additional-config", json.dumps(expected)]).additional_config == expected
    dotted = serve_parser.parse_args(["--additional-config.luce.kvflash.pool_tokens", "4096"])
    assert dotted.additional_config == expected
    assert serve_parser.parse_args([]).additional_config == {}


# --- zero, negative and non-integer sizes ---------------------------------------------------

SIZES = {  # (section, key): the smallest accepted value
    ("kvflash", "pool_tokens"): 1, ("kvflash", "chunk_tokens"): 16, ("kvflash", "sink_chunks"): 1,
    ("kvflash", "recent_chunks"): 4, ("pflash", "min_prompt_tokens"): 1, ("pflash", "chunk_tokens"): 1,
    ("pflash", "lookahead_tokens"): 1, ("pflash", "tail_chunks"): 1, ("pflash", "pool_kernel"): 1,
    ("pflash", "head_chunks"): 0, ("pflash", "early_exit_layers"): 0, ("dflash", "min_verify_tokens"): 1,
}


def _luce(section, key, value):
    settings = {key: value, **({"drafter": "/d"} if section == "pflash" else {})}
    return LuceConfig.from_sources({"luce": {section: settings}}, {})


@pytest.mark.parametrize("section, key", sorted(SIZES))
def test_zero_negative_and_non_integer_sizes_name_the_key(section, key):
    smallest = SIZES[(section, key)]
    assert getattr(getattr(_luce(section, key, smallest), section), key) == smallest  # the boundary is accepted
    bad = [smallest - 1, -64, smallest + 0.5, float(max(smallest, 16)), str(max(smallest, 16)), True, None]
    for value in bad:
        with pytest.raises(LuceConfigError) as err:
            _luce(section, key, value)
        start = f"luce.{section}.{key}: got {value!r}; expected "
        assert str(err.value).startswith(start), (value, str(err.value))
        assert str(err.value)[len(start):] == SCHEMA[section][key].accepted


@pytest.mark.parametrize("raw", ["0", "-1", "1.5", "4k"])
def test_sizes_from_the_environment_name_the_variable(raw):
    with pytest.raises(LuceConfigError, match=rf"^VLLM_LUCE_PFLASH_MIN_PROMPT_TOKENS: got .*{re.escape(raw)}.*; "
                                              r"expected an integer >= 1$"):
        LuceConfig.from_sources(None, {"VLLM_LUCE_PFLASH_MIN_PROMPT_TOKENS": raw})


# --- DFlash drafters: missing, pickle-only, truncated, GGUF without metadata ----------------

TARGET_TEXT = json.loads((trained_model("qwen36-target") / "config.json").read_text())


def _spec(model: str):
    return SimpleNamespace(speculative_config=None, spec_model=model, spec_method=None, spec_tokens=None,
                           max_num_seqs=64)  # set by the user: the draft-slot fit leaves it


@pytest.fixture
def dflash_drafter(tmp_path):
    return Path(shutil.copytree(trained_model("qwen36-dflash"), tmp_path / "drafter"))


def test_the_trained_drafter_passes_every_check(dflash_drafter):
    args = _spec(str(dflash_drafter))
    assert apply_dflash_defaults(args, "/t", TARGET_TEXT).path == str(dflash_drafter)
    assert (args.spec_method, args.spec_tokens) == ("dflash", 15)


def test_missing_gguf_drafter_path(tmp_path):
    with pytest.raises(R.DrafterNotFound, match=rf"^--speculative-model {tmp_path}/nope.gguf: no such GGUF file$"):
        apply_dflash_defaults(_spec(str(tmp_path / "nope.gguf")), "/t", TARGET_TEXT)


def test_pickle_only_dflash_drafter_is_refused_naming_the_file(dflash_drafter, tmp_path):
    (dflash_drafter / "model.safetensors").unlink()
    write_bait(dflash_drafter / "pytorch_model.bin", tmp_path / "fired")
    with pytest.raises(R.DrafterWeightsError) as err:
        apply_dflash_defaults(_spec(str(dflash_drafter)), "/t", TARGET_TEXT)
    assert str(err.value) == (f"--speculative-model: {dflash_drafter} has no *.safetensors weights "
                              "(found pytorch_model.bin: pickle checkpoints are never loaded)")
    assert not (tmp_path / "fired").exists()


def test_pickle_next_to_dflash_safetensors_is_not_read(dflash_drafter, tmp_path):
    write_bait(dflash_drafter / "pytorch_model.bin", tmp_path / "fired")
    assert apply_dflash_defaults(_spec(str(dflash_drafter)), "/t", TARGET_TEXT).path == str(dflash_drafter)
    assert not (tmp_path / "fired").exists()  # vLLM's loader then reads the safetensors only (e2e)


@pytest.mark.parametrize("cut, message", [
    (lambda b: b[:-1000], "is truncated: its header describes"),
    (lambda b: b[:100], "is not a complete safetensors file (header length"),
])
def test_truncated_dflash_safetensors_names_the_file(dflash_drafter, cut, message):
    f = dflash_drafter / "model.safetensors"
    f.write_bytes(cut(f.read_bytes()))
    with pytest.raises(R.DrafterWeightsError) as err:
        apply_dflash_defaults(_spec(str(dflash_drafter)), "/t", TARGET_TEXT)
    assert str(err.value).startswith(f"--speculative-model: {f} ") and message in str(err.value)
    # The same through --speculative-config names that flag.
    args = SimpleNamespace(speculative_config={"model": str(dflash_drafter)}, spec_model=None, spec_method=None,
                           spec_tokens=None)
    with pytest.raises(R.DrafterWeightsError, match=r"^--speculative-config model: "):
        apply_dflash_defaults(args, "/t", TARGET_TEXT)


@pytest.mark.parametrize("drop, message", [
    ("block_size", "DFlash drafter {d}: config.json has block_size None; expected an integer >= 2"),
    ("target_layer_ids", "DFlash drafter {d} does not match target /t:\n"
                         "  - dflash_config.target_layer_ids: missing in the drafter config"),
])
def test_zlab_drafter_config_without_metadata_names_the_file(dflash_drafter, drop, message):
    cfg = json.loads((dflash_drafter / "config.json").read_text())
    cfg.pop(drop, None)
    cfg["dflash_config"].pop(drop, None)
    (dflash_drafter / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(R.DrafterMismatch) as err:
        apply_dflash_defaults(_spec(str(dflash_drafter)), "/t", TARGET_TEXT)
    assert str(err.value) == message.format(d=dflash_drafter)


@pytest.mark.parametrize("key", ["dflash.block_size", "dflash.target_layer_ids", "dflash.mask_token_id",
                                 "rope.freq_base"])
def test_gguf_drafter_without_metadata_names_the_key(tmp_path, monkeypatch, key):
    import gguf

    from vllm_luce.spec_decode.gguf_drafter import DrafterFormatError, write_gguf

    for method in ("add_uint32", "add_float32", "add_array"):
        original = getattr(gguf.GGUFWriter, method)

        def skip(self, name, *a, _original=original, **kw):
            return None if name.endswith("." + key) else _original(self, name, *a, **kw)

        monkeypatch.setattr(gguf.GGUFWriter, method, skip)
    out = tmp_path / "target-DFlash.gguf"
    write_gguf(trained_model("qwen36-dflash"), out)
    monkeypatch.undo()
    assert f"qwen35-dflash-draft.{key}" not in gguf.GGUFReader(str(out)).fields
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(DrafterFormatError, match=rf"^{out}: missing GGUF key qwen35-dflash-draft\.{re.escape(key)}$"):
        apply_dflash_defaults(_spec(str(out)), "/t", TARGET_TEXT)


# --- PFlash drafter: a pickle next to the safetensors is never read -------------------------

def test_pickle_next_to_pflash_safetensors_is_not_read(tmp_path):
    from vllm_luce.pflash.drafter_spec import DrafterSpec

    drafter = Path(shutil.copytree(trained_model("scorer"), tmp_path / "scorer"))
    write_bait(drafter / "pytorch_model.bin", tmp_path / "fired")
    spec = DrafterSpec.load(drafter)
    assert {file for file, _ in spec.tensors.values()} == {"model.safetensors"}
    assert not (tmp_path / "fired").exists()  # the scorer itself loads on the workers (e2e)
