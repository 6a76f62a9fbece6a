"""Who may import whom among the repository's top-level packages (issue 42):

* ``fixtures/`` is the one fixtures package; tests and benchmarks both import it, and it imports neither.
* ``benchmarks/`` never imports ``tests``.
* ``tests/`` imports nothing from ``benchmarks``, with one exception: a unit test of a benchmark script's own logic,
  ``tests/benchmarks/test_<module>.py``, imports ``benchmarks.<module>`` (the module under test) and nothing else of
  ``benchmarks``. Every other test reaches a benchmark only by running it as users do, in a subprocess
  (``python -m benchmarks.<module> --tiny ...``).
* ``vllm_luce`` (what pip installs) imports none of the three, nor the test environment's plugin
  ``testenv/luce_cpu_speedups`` (CPU speed-ups for the test hosts), and packaging ships only ``vllm_luce``.
* That plugin imports none of ``tests``, ``benchmarks`` and ``fixtures`` either.
"""

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported(path: Path) -> set[str]:
    """Every absolute module an import statement in ``path`` names (function-level imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}  # from benchmarks import x
    return names


def top(name: str) -> str:
    return name.split(".")[0]


def offenders(folder: str, forbidden: set[str], allowed=lambda path, name: False) -> list[str]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for name in sorted(imported(path)):
            if top(name) in forbidden and not allowed(path, name):
                found.append(f"{path.relative_to(ROOT)}: {name}")
    return found


def benchmark_under_test(path: Path, name: str) -> bool:
    """tests/benchmarks/test_<module>.py may import benchmarks.<module> (and the package itself, to reach it)."""
    if path.parent != ROOT / "tests" / "benchmarks" or not path.name.startswith("test_"):
        return False
    module = path.stem.removeprefix("test_")
    return name in ("benchmarks", f"benchmarks.{module}") or name.startswith(f"benchmarks.{module}.")


def test_tests_import_no_benchmark_but_the_one_they_test():
    assert offenders("tests", {"benchmarks"}, benchmark_under_test) == []


def test_benchmarks_import_no_tests():
    assert offenders("benchmarks", {"tests"}) == []


def test_fixtures_import_neither_tests_nor_benchmarks():
    assert offenders("fixtures", {"tests", "benchmarks"}) == []


def test_the_plugin_imports_none_of_them_and_ships_alone():
    assert offenders("vllm_luce", {"tests", "benchmarks", "fixtures", "luce_cpu_speedups"}) == []
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert all(pattern.startswith("vllm_luce") for pattern in find["include"]), find


def test_the_test_environments_plugin_imports_none_of_them():
    assert offenders("testenv", {"tests", "benchmarks", "fixtures"}) == []
    assert list((ROOT / "testenv").rglob("luce_cpu_speedups/__init__.py")), "testenv/luce_cpu_speedups is missing"


def test_the_rule_catches_what_it_forbids(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os\ndef f():\n    from benchmarks import fidelity\n    import tests.gpu.engine\n")
    assert {"benchmarks.fidelity", "tests.gpu.engine"} <= imported(probe)
    here = ROOT / "tests" / "benchmarks" / "test_dflash_throughput.py"
    assert benchmark_under_test(here, "benchmarks.dflash_throughput")
    assert not benchmark_under_test(here, "benchmarks.fidelity")
    assert not benchmark_under_test(ROOT / "tests" / "e2e" / "test_load.py", "benchmarks.load_test")
