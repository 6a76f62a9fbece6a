import pytest

from vllm_luce import source_signatures
from vllm_luce.compat import installed_series
from vllm_luce.hook_ledger import LEDGER, PatchTargetChanged
from vllm_luce.patches import wrap_method


class Target:
    def method(self, x):
        return x + 1


def add_ten(original):
    def method(self, x):
        return original(self, x) + 10
    return method


def test_wrap_checks_the_signature_and_is_idempotent():
    class Fresh(Target):
        def method(self, x):
            return x + 1

    with pytest.raises(PatchTargetChanged, match=r"has signature \(self, x\); vllm-luce expects \(self\)"):
        wrap_method(Fresh, "method", "(self)", add_ten)
    assert wrap_method(Fresh, "method", "(self, x)", add_ten) is True
    assert wrap_method(Fresh, "method", "(self, x)", add_ten) is False
    assert Fresh().method(1) == 12
    with pytest.raises(PatchTargetChanged, match="no longer exists"):
        wrap_method(Fresh, "gone", "(self)", add_ten)


def test_every_ledger_target_exists_in_the_installed_vllm():
    import importlib

    series = installed_series()
    for entry in LEDGER:
        if entry.signature_in(series) is None:
            continue
        module_name, qualname = entry.target.split(":")
        module = importlib.import_module(module_name)
        if "." in qualname:
            owner_name, attr = qualname.rsplit(".", 1)
            owner = getattr(module, owner_name)
            found = owner.__dict__[attr] if attr in owner.__dict__ else getattr(owner, attr)  # may be inherited
        else:  # a module-level function
            found = getattr(module, qualname)
        found = getattr(found, "__func__", found)  # a staticmethod
        assert source_signatures.of_function(found) == entry.signature_in(series), entry.target
        assert entry.why and entry.how and entry.remove_when
        importlib.import_module(entry.module)


def test_every_cpu_patch_has_a_drafted_upstream_issue():
    """vllm-luce patches vLLM's CPU backend only for a vLLM bug or a CPU path a feature needs, each with the issue
    to file upstream (a title; symptom, cause and proposed fix); speed-ups for the test hosts are the test
    environment's plugin (testenv/luce_cpu_speedups)."""
    cpu = [e for e in LEDGER if e.module.startswith("vllm_luce.patches.cpu_")]
    assert cpu
    for entry in cpu:
        issue = entry.upstream_issue
        assert issue is not None, f"{entry.target} has no upstream issue draft in vllm_luce/hook_ledger.py"
        assert all(len(text) >= 40 for text in (issue.title, issue.symptom, issue.cause, issue.fix)), entry.target
        assert "\n" not in issue.title, entry.target


def test_wrap_keeps_a_staticmethod_static():
    class Owner:
        @staticmethod
        def build(x):
            return x * 2

    assert wrap_method(Owner, "build", "(x)", lambda original: lambda x: original(x) + 1) is True
    assert isinstance(Owner.__dict__["build"], staticmethod)
    assert Owner.build(3) == 7 and Owner().build(3) == 7


def test_when_imported_runs_after_the_module_executes(tmp_path, monkeypatch):
    import sys

    from vllm_luce.patches import when_imported

    pkg = tmp_path / "luce_probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "target.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("luce_probe_pkg.target", lambda: seen.append(sys.modules["luce_probe_pkg.target"].VALUE))
    assert seen == []  # not imported yet: nothing ran, nothing was imported
    from luce_probe_pkg import target  # noqa: F401

    assert seen == [1]
    when_imported("luce_probe_pkg.target", lambda: seen.append("again"))  # already loaded: runs now
    assert seen == [1, "again"]
