"""The ledger and every row of the hook table against every vLLM release the README claims, through snapshots of
their wheels (``scripts/vllm_signatures.py``), and the source reader both sides use."""

import json
import textwrap
from pathlib import Path

import pytest

from vllm_luce import compat, hook_signatures, hooks, source_signatures
from vllm_luce.hook_ledger import LEDGER

SNAPSHOTS = Path(__file__).parent / "vllm_signatures"
PATCHED = {e.target: e for e in LEDGER}
IMPORTED = source_signatures.imported_vllm_modules(Path(__file__).resolve().parents[2] / "vllm_luce")
V1_MODULE = "vllm.v1.worker.gpu_model_runner"  # Model Runner V1 (vLLM 0.34 has none)


def snapshot_of(release: str) -> dict[str, str | None]:
    return json.loads((SNAPSHOTS / f"{release}.json").read_text())


def mismatches(snapshot: dict[str, str | None], series: str, rows=hooks.HOOKS) -> list[str]:
    """Every name a row checks that the release does not have as recorded: a patched target's signature (the
    ledger's, unless it leaves the target alone in the series), any other name as ``hook_signatures`` records it
    (a signature, a class or an attribute; None: absent there)."""
    found = []
    for row in rows:
        for name in row.checks:
            entry = PATCHED.get(name)
            expected = entry.signature_in(series) if entry else hook_signatures.expected_in(name, series)
            if (expected is not None or not entry) and snapshot[name] != expected:
                found.append(f"{row.kind} row {row.target!r} ({', '.join(row.owners)}) relies on {name}: "
                             f"vLLM {series} has {snapshot[name]!r}, the table records {expected!r}")
    return found


@pytest.mark.parametrize("release", compat.SNAPSHOT_RELEASES)
def test_every_hook_row_matches_the_release(release):
    snapshot = snapshot_of(release)
    names = {e.target for e in LEDGER} | {name for row in hooks.HOOKS for name in row.checks} | \
        set().union(*IMPORTED.values())
    assert set(snapshot) == names, (f"run scripts/vllm_signatures.py {release}: the snapshot lacks "
                                    f"{sorted(names - set(snapshot))}, has stale {sorted(set(snapshot) - names)}")
    found = mismatches(snapshot, compat.series(release))
    assert not found, "\n".join(found)


def left_alone(module: str, series: str, has_v1: bool) -> bool:
    """Whether no code of vllm_luce ``module`` runs on a release: a Model Runner V1 binding (``*_v1``, the layout
    rule) where the release has no V1, or the patch module of ledger entries all left alone in the series."""
    entries = [e for e in LEDGER if e.module == module]
    return (module.endswith("_v1") and not has_v1) or bool(entries) and all(e.signature_in(series) is None
                                                                            for e in entries)


def import_breaches(snapshot: dict[str, str | None], series: str, imported=None) -> list[str]:
    """A module of vllm_luce that runs on the release and imports a vLLM module the release lacks; a Model Runner V1
    row whose target a release without V1 has all the same (its bindings would run)."""
    has_v1 = snapshot.get(V1_MODULE) is not None
    found = [f"{module} imports {', '.join(sorted(missing))}, which vLLM {series} lacks"
             for module, names in sorted((imported or IMPORTED).items())
             if (missing := {n for n in names if snapshot[n] is None}) and not left_alone(module, series, has_v1)]
    if not has_v1:
        found += [f"the V1 row {row.target!r} binds {row.checks[0]}, which vLLM {series} has"
                  for row in hooks.HOOKS if row.runner == hooks.V1 and snapshot[row.checks[0]] is not None]
    return found


@pytest.mark.parametrize("release", compat.SNAPSHOT_RELEASES)
def test_no_module_that_runs_on_a_release_imports_a_vllm_module_it_lacks(release):
    assert not import_breaches(snapshot_of(release), compat.series(release))


def test_the_import_rule_catches_a_deleted_module_imported_where_it_runs():
    snapshot = dict(snapshot_of("0.34.0"))
    assert snapshot[V1_MODULE] is None and snapshot["vllm.v1.spec_decode.dflash"] is None
    planted = {"vllm_luce.spec_decode.plain_steps_v2": {"vllm.v1.spec_decode.dflash"},
               "vllm_luce.kvflash.worker_v1": {V1_MODULE}, "vllm_luce.patches.dflash_proposer_v1": {V1_MODULE}}
    assert import_breaches(snapshot, "0.34", planted) == [
        "vllm_luce.spec_decode.plain_steps_v2 imports vllm.v1.spec_decode.dflash, which vLLM 0.34 lacks"]
    snapshot["vllm.v1.worker.block_table:BlockTable.compute_slot_mapping"] = "(self)"  # a V1 row's target kept
    assert len(import_breaches(snapshot, "0.34", planted)) == 2


def test_every_row_checks_a_vllm_name_and_every_recorded_name_is_checked():
    for row in hooks.HOOKS:
        assert row.checks and all(name.startswith("vllm") and ":" in name for name in row.checks), row.target
    checked = {name for row in hooks.HOOKS for name in row.checks}
    assert not set(hook_signatures.EXPECTED) & set(PATCHED), "a patched target's signatures are the ledger's"
    assert set(hook_signatures.EXPECTED) == checked - set(PATCHED), "hook_signatures.py: stale or missing names"
    assert set(hook_signatures.PER_SERIES) <= set(hook_signatures.EXPECTED)


def test_a_changed_vllm_name_fails_the_check():
    row = next(h for h in hooks.HOOKS if h.kind == hooks.INSTANCE_WRAP)
    snapshot = dict(snapshot_of("0.32.0"))
    assert not mismatches(snapshot, "0.32", [row])
    snapshot[row.checks[0]] = "(self, renamed)"
    assert mismatches(snapshot, "0.32", [row])
    snapshot[row.checks[0]] = None  # gone from the release
    assert mismatches(snapshot, "0.32", [row])


@pytest.mark.parametrize("release", compat.SNAPSHOT_RELEASES)
def test_every_ledger_entry_matches_the_release(release):
    snapshot = json.loads((SNAPSHOTS / f"{release}.json").read_text())
    series = compat.series(release)
    missing = [e.target for e in LEDGER if e.target not in snapshot]
    assert not missing, f"run scripts/vllm_signatures.py {release}: the snapshot lacks {missing}"
    for entry in LEDGER:
        recorded = entry.signature_in(series)
        if recorded is None:  # left alone in this series, explicitly; the release may still have it
            continue
        assert snapshot[entry.target] == recorded, f"{entry.target} in vLLM {release}"


def test_every_supported_series_has_a_snapshot_and_absent_targets_are_skipped():
    assert sorted(compat.series(r) for r in compat.SNAPSHOT_RELEASES) == sorted(compat.SUPPORTED_SERIES)
    for release in compat.SNAPSHOT_RELEASES:
        snapshot = json.loads((SNAPSHOTS / f"{release}.json").read_text())
        for entry in LEDGER:
            if snapshot[entry.target] is None:
                assert entry.signature_in(compat.series(release)) is None, (entry.target, release)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_in_tree_follows_imports_and_base_classes(tmp_path):
    root = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/ops.py": """
            def conv(x: 'torch.Tensor', width: int = 4, *, act: str | None = 'silu', **kw) -> None:
                pass
            """,
        "pkg/base.py": """
            class Base:
                def propose(self, n, ids: list[int] = None):
                    pass
            """,
        "pkg/user.py": """
            from pkg.ops import conv as conv_alias
            from pkg.base import Base

            class Child(Base):
                def other(self):
                    pass

            class Redefined:
                def f(self, a):
                    pass
                def f(self, a, b):
                    pass
            """,
    })
    assert source_signatures.in_tree(root, "pkg.user:conv_alias") == \
        "(x: 'torch.Tensor', width: int=4, *, act: str | None='silu', **kw) -> None"
    assert source_signatures.in_tree(root, "pkg.user:Child.propose") == "(self, n, ids: list[int]=None)"
    assert source_signatures.in_tree(root, "pkg.user:Redefined.f") == "(self, a, b)"  # the last binding wins
    assert source_signatures.in_tree(root, "pkg.user:Child.gone") is None
    assert source_signatures.in_tree(root, "pkg.missing:f") is None


def test_in_tree_tells_classes_attributes_and_modules(tmp_path):
    root = _tree(tmp_path, {
        "pkg/__init__.py": "from .defs import Config as Public\nREGISTRY = object()\n",
        "pkg/defs.py": """
            class Config:
                field: int = 0
                flag = False

                def __init__(self):
                    self.state = {}
                    self.flag = True
                    (self.groups, sizes), *self.rest = (([], 0), 1)  # unpacked, as vLLM's runners assign

            class Derived(Config):
                pass
            """,
    })
    assert source_signatures.in_tree(root, "pkg:Public") == source_signatures.CLASS  # a relative import followed
    assert source_signatures.in_tree(root, "pkg:REGISTRY") == source_signatures.ATTRIBUTE
    assert source_signatures.in_tree(root, "pkg.defs") == source_signatures.MODULE
    for name in ("field", "flag", "state", "groups", "rest"):
        assert source_signatures.in_tree(root, f"pkg.defs:Derived.{name}") == source_signatures.ATTRIBUTE, name
    assert source_signatures.in_tree(root, "pkg.defs:Config.other") is None
    assert source_signatures.in_tree(root, "pkg.defs:Config.sizes") is None  # a local of the method


def test_of_function_reads_a_live_function_as_in_tree_reads_its_file(tmp_path, monkeypatch):
    root = _tree(tmp_path, {"probe_sig_mod.py": """
        import functools

        def deco(f):
            @functools.wraps(f)
            def inner(*a, **k):
                return f(*a, **k)
            return inner

        class Owner:
            @deco
            def run(self, x: int, y: 'Fwd | None' = None) -> 'Fwd':
                return x
        """})
    monkeypatch.syspath_prepend(str(root))
    import probe_sig_mod

    assert source_signatures.of_function(probe_sig_mod.Owner.run) == source_signatures.in_tree(root, "probe_sig_mod:Owner.run") \
        == "(self, x: int, y: 'Fwd | None'=None) -> 'Fwd'"
