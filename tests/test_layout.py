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
* No module of ``vllm_luce`` imports itself back through others (function-level imports included).
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


def module_imports(root: Path, package: str) -> dict[str, set[str]]:
    """Each module of ``package`` under ``root`` -> the modules of the package it imports (lazy imports too;
    ``from pkg import name`` counts the submodule ``pkg.name`` where there is one, else ``pkg``)."""
    files = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (root / package).rglob("*.py")}

    def owner(name: str) -> str | None:
        while name not in files and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in files else None

    graph = {}
    for module, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1] if node.level else []
                source = ".".join(base + ([node.module] if node.module else []))
                names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in files else source
                         for alias in node.names]
            else:
                continue
            targets |= {owner(name) for name in names if name.split(".")[0] == package}
        graph[module] = targets - {None, module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, found, counter = {}, {}, [], [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_of_the_plugin_imports_itself_back():
    """No file cycle in vllm_luce/ (function-level imports included): each module sits below those that import it."""
    assert cycles(module_imports(ROOT, "vllm_luce")) == []


def test_the_cycle_rule_catches_a_lazy_cycle(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.sub import b\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\n")
    graph = module_imports(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_the_version_is_pyprojects():
    from vllm_luce.version import __version__

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == __version__
