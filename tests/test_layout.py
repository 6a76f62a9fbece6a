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
* No module of ``vllm_luce`` imports itself back through others (function-level imports included), nor does any of
  its packages, and the packages stand in layers (``LAYERS``): the features side by side on the base, the seams
  where two features meet, the vLLM bindings on top.
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


def package_of(module: str) -> str:
    """A module's package: the first-level subpackage or top-level module of the root package it lies in
    (``vllm_luce.kvflash.pager`` -> ``kvflash``, ``vllm_luce.hooks`` -> ``hooks``); the root's own
    ``__init__`` is the root (``vllm_luce``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_imports(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto packages (``package_of``): each package -> the other packages it imports."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        packages.setdefault(package_of(module), set()).update(package_of(t) for t in targets)
    return {package: targets - {package} for package, targets in packages.items()}


# The layers of vllm_luce's packages, bottom up. A package imports only packages of its own layer or lower ones,
# except that a feature imports no other feature: what two features share goes through a seam.
BASE = {"version", "compat", "config", "log", "request_args", "overrides", "metrics", "kernels",
        "hooks", "hook_ledger", "hook_overrides", "hook_signatures", "source_signatures",  # the touch table
        "architectures", "checkpoint_headers"}
FEATURES = {"kvflash", "spec_decode", "pflash"}
SEAMS = {"scorer_policy",  # KVFlash's scorer policy on PFlash's drafter (kvflash -> scorer_policy -> pflash)
         "schedulers"}  # the DFlash gate's scheduler classes, with KVFlash's mixin
BINDINGS = {"patches", "model_executor", "vllm_luce", "cli", "dry_run",  # vLLM's patches and entry points
            "vllm026"}  # the code vllm-luce runs for vLLM 0.26 alone, reached only through the hook table
LAYERS = {**dict.fromkeys(BASE, 0), **dict.fromkeys(FEATURES, 1), **dict.fromkeys(SEAMS, 2),
          **dict.fromkeys(BINDINGS, 3)}


def layer_breaches(packages: dict[str, set[str]]) -> list[str]:
    found = [f"{p}: in no layer of tests/test_layout.py" for p in sorted(packages) if p not in LAYERS]
    for package, targets in sorted(packages.items()):
        for target in sorted(targets):
            if package not in LAYERS or target not in LAYERS:
                continue
            if package in FEATURES and target in FEATURES:
                found.append(f"{package} -> {target}: features meet only through a seam")
            elif LAYERS[target] > LAYERS[package] and not (package in FEATURES and target in SEAMS):
                found.append(f"{package} -> {target}: an import up the layers")
    return found


def test_no_package_of_the_plugin_imports_itself_back():
    """No cycle among vllm_luce's packages (function-level imports included). A package is a first-level
    subpackage (``kvflash/``, ``spec_decode/``, ``pflash/``, ``kernels/``, ``metrics/``, ``patches/``,
    ``model_executor/``) or a top-level module (``hooks.py``, ``config.py``, ...); the root ``__init__.py`` (the
    plugin's entry point, ``register()``) is the package ``vllm_luce``. ``package_of`` maps a module onto it."""
    packages = package_imports(module_imports(ROOT, "vllm_luce"))
    assert cycles(packages) == [], {p: sorted(t) for p, t in packages.items()}


def test_the_packages_stand_in_their_layers():
    """Base (settings, logging, vLLM versions, kernels, metrics, the touch table) < features (KVFlash, DFlash,
    PFlash, side by side) < seams < bindings (patches, executors, entry points): no import runs up, no feature
    imports another (a feature may import a seam that lies on another feature), and every package has a layer."""
    assert layer_breaches(package_imports(module_imports(ROOT, "vllm_luce"))) == []


def test_the_package_rules_catch_a_cycle_between_packages(tmp_path):
    """Two packages that import each other through different files: no file cycle, a package cycle."""
    for folder in ("pkg", "pkg/a", "pkg/b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a" / "x.py").write_text("from pkg.b import y\n")
    (tmp_path / "pkg" / "b" / "y.py").write_text("")
    (tmp_path / "pkg" / "b" / "z.py").write_text("def f():\n    from ..a import w\n")
    (tmp_path / "pkg" / "a" / "w.py").write_text("")
    (tmp_path / "pkg" / "top.py").write_text("import pkg.a.x\n")
    graph = module_imports(tmp_path, "pkg")
    assert cycles(graph) == []
    packages = package_imports(graph)
    assert packages["a"] == {"b"} and packages["b"] == {"a"} and packages["top"] == {"a"} and packages["pkg"] == set()
    assert cycles(packages) == [["a", "b"]]
    assert layer_breaches({"kvflash": {"pflash", "patches", "scorer_policy"}, "hooks": {"kvflash"}, "new": set()}) == [
        "new: in no layer of tests/test_layout.py", "hooks -> kvflash: an import up the layers",
        "kvflash -> patches: an import up the layers", "kvflash -> pflash: features meet only through a seam"]


def test_the_version_is_pyprojects():
    from vllm_luce.version import __version__

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == __version__
