"""The ledger against every vLLM release the README claims, through signature snapshots of their wheels
(``scripts/vllm_signatures.py``), and the source reader both sides use."""

import json
import textwrap
from pathlib import Path

import pytest

from vllm_luce import compat
from vllm_luce.patches import LEDGER, signatures

SNAPSHOTS = Path(__file__).parent / "vllm_signatures"


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
    assert signatures.in_tree(root, "pkg.user:conv_alias") == \
        "(x: 'torch.Tensor', width: int=4, *, act: str | None='silu', **kw) -> None"
    assert signatures.in_tree(root, "pkg.user:Child.propose") == "(self, n, ids: list[int]=None)"
    assert signatures.in_tree(root, "pkg.user:Redefined.f") == "(self, a, b)"  # the last binding wins
    assert signatures.in_tree(root, "pkg.user:Child.gone") is None
    assert signatures.in_tree(root, "pkg.missing:f") is None


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

    assert signatures.of_function(probe_sig_mod.Owner.run) == signatures.in_tree(root, "probe_sig_mod:Owner.run") \
        == "(self, x: int, y: 'Fwd | None'=None) -> 'Fwd'"
