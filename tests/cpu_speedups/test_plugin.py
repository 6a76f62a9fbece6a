"""The test environment's plugin (testenv/luce_cpu_speedups): installed with its entry point, its table true to the
installed vLLM and to its README, and each patch applied only on the CPUs its row names, on every host kind
(``force_host``)."""

import importlib
import importlib.metadata as md
import re
import tomllib
from pathlib import Path

import pytest
import torch

G = pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention")

import luce_cpu_speedups  # noqa: E402
from luce_cpu_speedups import bf16_linear, dflash_context_kv, gdn_chunk, gdn_prefill_conv, isa  # noqa: E402
from tests.patches.test_cpu_isa import BF16_DOT, HOSTS, force_host  # noqa: E402
from vllm_luce import source_signatures  # noqa: E402

HERE = Path(luce_cpu_speedups.__file__).resolve().parents[1]  # testenv/luce_cpu_speedups
ROOT = Path(__file__).resolve().parents[2]
MODULES = {bf16_linear: 0, dflash_context_kv: 1, gdn_chunk: 2, gdn_prefill_conv: 3}  # their PATCHES rows


def _target(target: str):
    """(holder, name) of a "module:name" or "module:Class.name" target."""
    module, _, qualname = target.partition(":")
    holder = importlib.import_module(module)
    *owner, name = qualname.split(".")
    for part in owner:
        holder = getattr(holder, part)
    return holder, name


def test_it_is_installed_from_this_checkout_with_its_entry_point():
    assert HERE == ROOT / "testenv" / "luce_cpu_speedups", HERE  # scripts/setup.sh: pip install -e
    plugins = {e.name: e.value for e in md.entry_points(group="vllm.general_plugins")}
    assert plugins.get("luce_cpu_speedups") == "luce_cpu_speedups:register", plugins
    pyproject = tomllib.loads((HERE / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["vllm.general_plugins"] == {
        "luce_cpu_speedups": "luce_cpu_speedups:register"}


def test_every_patch_matches_the_installed_vllm_and_its_module():
    for patch in luce_cpu_speedups.PATCHES:
        holder, name = _target(patch.target)
        found = vars(holder)[name]
        found = getattr(found, "__wrapped__", found)  # applied in this process already
        assert source_signatures.of_function(found) == patch.signature, patch.target
        module = importlib.import_module(patch.module)
        assert module.TARGET == patch.target and callable(module.apply)
    assert [luce_cpu_speedups.PATCHES[i].module for i in MODULES.values()] == [m.__name__ for m in MODULES]


def test_the_readme_lists_every_patch_and_no_other():
    listed = re.findall(r"^\| `([^`]+)` \|", (HERE / "README.md").read_text(), re.M)
    assert listed == [p.target for p in luce_cpu_speedups.PATCHES]


def test_register_applies_each_patch_when_its_module_is_imported(monkeypatch):
    import vllm_luce.patches

    seen = []
    monkeypatch.setattr(vllm_luce.patches, "when_imported", lambda module, apply: seen.append((module, apply)))
    monkeypatch.setattr(luce_cpu_speedups, "_registered", False)
    luce_cpu_speedups.register()
    luce_cpu_speedups.register()  # once per process
    assert seen == [(p.target.split(":")[0], importlib.import_module(p.module).apply)
                    for p in luce_cpu_speedups.PATCHES]


@pytest.mark.parametrize("kind", HOSTS)
def test_detection_follows_the_host_kind(monkeypatch, kind):
    force_host(monkeypatch, kind)
    assert isa.bf16_dot_products() is (kind in BF16_DOT)
    assert isa.native_bf16() is (kind in BF16_DOT)


def test_amx_alone_counts_as_native_bf16(monkeypatch):
    """``native_bf16``'s other branch: AMX without bf16 dot products (no such CPU is sold)."""
    force_host(monkeypatch, "avx2")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert not isa.bf16_dot_products() and isa.native_bf16()


@pytest.mark.parametrize("kind", HOSTS)
@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_each_patch_applies_only_on_the_cpus_it_names(monkeypatch, kind, module):
    """The float32 ones only without native bf16; the prompt conv on every CPU (its wrapper picks the branch)."""
    force_host(monkeypatch, kind)
    holder, name = _target(module.TARGET)
    before = vars(holder)[name]
    monkeypatch.setattr(holder, name, before)  # whatever apply() does is undone after the test
    done = module.apply()
    after = vars(holder)[name]
    if kind in BF16_DOT and module is not gdn_prefill_conv:
        assert done is False and after is before
    else:  # wrapped now, or by an earlier apply() in this process
        assert getattr(after, "__luce_patched__", False) and done is (after is not before)
