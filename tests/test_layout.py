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
* V1 and V2 apart: a module that binds one of vLLM's two model runners alone ends in ``_v1`` or ``_v2``, as the
  hook table's column ``runner`` says of its rows, and imports nothing of the other runner's.
* vLLM 0.26 in one place: no module outside ``vllm_luce/vllm026/`` branches on the vLLM series or names 0.26 in code,
  and none imports that package; only the hook rows and the ledger entry whose removal condition names 0.26 reach it.
"""

import ast
import re
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
        "hooks", "hook_ledger", "hook_overrides", "hook_signatures", "hook_reads",  # the touch table
        "source_signatures", "architectures", "checkpoint_headers"}
FEATURES = {"kvflash", "spec_decode", "pflash"}
SEAMS = {"scorer_policy",  # PFlash's drafter attached to KVFlash as its scorer policy (a hook row after both)
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
            elif LAYERS[target] > LAYERS[package]:
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
    imports another nor a seam (a seam attaches to the features by its hook row), and every package has a layer."""
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
        "kvflash -> patches: an import up the layers", "kvflash -> pflash: features meet only through a seam",
        "kvflash -> scorer_policy: an import up the layers"]  # a seam attaches to the features, never the reverse


def test_the_version_is_pyprojects():
    from vllm_luce.version import __version__

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == __version__


# ------------------------------------------------------------------ V1, V2 and vLLM 0.26
# vLLM has two model runners: V1 (vllm/v1/worker/gpu_model_runner.py, and the CPU runner built on it) and Model
# Runner V2 (vllm/v1/worker/gpu/). A vllm-luce module that binds one of them alone ends in _v1 or _v2, and what both
# share is the module of the same name without it (kvflash/worker.py beside worker_v1.py and worker_v2.py); the hook
# table's column ``runner`` says which runner each row binds. The code vllm-luce runs for vLLM 0.26 alone is the
# package vllm_luce/vllm026/, reached only through the hook rows and the ledger entry whose removal condition names
# 0.26, so that dropping 0.26 is deleting the package and those rows.

OLD_SERIES, OLD_PACKAGE = "0.26", "vllm_luce.vllm026"
SERIES_MODULE = "vllm_luce.compat"  # the supported series themselves
TABLE_MODULES = {"vllm_luce.hooks", "vllm_luce.hook_ledger"}  # the rows that reach OLD_PACKAGE, by name
VERSION_FUNCTIONS = {"installed_series", "series", "signature_series", "parse_version"}  # compat.py's


def module_trees(root: Path = ROOT, package: str = "vllm_luce") -> dict[str, ast.Module]:
    return {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): ast.parse(p.read_text())
            for p in sorted((root / package).rglob("*.py"))}


def _reads_the_version(node: ast.AST) -> bool:
    """Whether an expression calls one of compat.py's version functions or reads a ``__version__``."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
            if name in VERSION_FUNCTIONS:
                return True
        if isinstance(n, ast.Attribute) and n.attr == "__version__":
            return True
    return False


def series_branches(trees: dict[str, ast.Module]) -> list[str]:
    """Outside OLD_PACKAGE (and compat.py, which lists the series): a "0.26" in code other than a per-series record's
    key, a comparison or lookup by the vLLM version or series, the package's dotted name outside the hook table, or an
    import of it."""
    found = []
    for module, tree in trees.items():
        if module == OLD_PACKAGE or module.startswith(OLD_PACKAGE + ".") or module == SERIES_MODULE:
            continue
        keys = {id(k) for n in ast.walk(tree) if isinstance(n, ast.Dict) for k in n.keys if k is not None}
        for node in ast.walk(tree):
            where = f"{module} line {getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(re.escape(OLD_SERIES) + r"(\.\d+)*", node.value) and id(node) not in keys:
                    found.append(f"{where}: {node.value!r} (vLLM {OLD_SERIES}'s code goes in {OLD_PACKAGE})")
                elif OLD_PACKAGE in node.value and module not in TABLE_MODULES:
                    found.append(f"{where}: names {OLD_PACKAGE} (only the hook table's rows reach it)")
            elif isinstance(node, ast.Compare) and any(_reads_the_version(n) for n in (node.left, *node.comparators)):
                found.append(f"{where}: compares the vLLM version or series")
            elif isinstance(node, ast.Subscript) and _reads_the_version(node.slice):
                found.append(f"{where}: looks up by the vLLM version or series")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(n == OLD_PACKAGE or n.startswith(OLD_PACKAGE + ".") for n in names):
                    found.append(f"{where}: imports {OLD_PACKAGE} (only the hook table's rows reach it)")
    return found


def test_no_module_outside_vllm026_branches_on_vllm_026_or_imports_it():
    assert series_branches(module_trees()) == []


def off_the_package(rows, ledger, supported: tuple[str, ...]) -> list[str]:
    """A hook row or ledger entry whose removal condition names vLLM 0.26 with code outside OLD_PACKAGE, code in it
    whose row goes on after 0.26, and a ledger entry applied on 0.26 alone outside it."""
    def inside(path: str) -> bool:
        return path.split(":")[0] == OLD_PACKAGE or path.startswith(OLD_PACKAGE + ".")

    found = []
    for row in rows:
        names_old = f"vLLM {OLD_SERIES}" in row.remove_when
        for owner in row.owners:
            if names_old != inside(owner):
                found.append(f"{row.target} ({owner}): " + (f"goes with vLLM {OLD_SERIES}, its code in {OLD_PACKAGE}"
                                                            if names_old else f"stays after vLLM {OLD_SERIES}, its "
                                                            f"code outside {OLD_PACKAGE}"))
    for entry in ledger:
        only_old = [s for s in supported if entry.signature_in(s) is not None] == [OLD_SERIES]
        if (f"vLLM {OLD_SERIES}" in entry.remove_when or only_old) != inside(entry.module):
            found.append(f"{entry.target} ({entry.module}): a patch for vLLM {OLD_SERIES} alone lives in "
                         f"{OLD_PACKAGE}, and only such a patch")
    return found


def test_every_row_that_goes_with_vllm_026_has_its_code_in_vllm026():
    from vllm_luce import hooks
    from vllm_luce.compat import SUPPORTED_SERIES
    from vllm_luce.hook_ledger import LEDGER

    assert off_the_package(hooks.HOOKS, LEDGER, SUPPORTED_SERIES) == []
    owned = {o.split(":")[0] for h in hooks.HOOKS for o in h.owners}
    graph = module_imports(ROOT, "vllm_luce")
    package = {m for m in graph if m.startswith(OLD_PACKAGE + ".")}
    reached = {m for m in package if m in owned or any(m in graph[o] for o in package & owned)}
    assert package and reached == package, f"modules of {OLD_PACKAGE} no row reaches: {sorted(package - reached)}"


def runner_of_module(module: str) -> str | None:
    stem = module.rsplit(".", 1)[-1]
    return next((r for r in ("V1", "V2") if stem.endswith("_" + r.lower())), None)


def runner_breaches(rows, graph: dict[str, set[str]], runner_of_target) -> list[str]:
    """A row of one runner whose code is not in a module of that runner's name, a row of neither (or of both) with
    code in such a module only, a runner the row's vLLM target contradicts, a why that says the runner itself (the
    column does), a module of one runner's name that owns no row of it or imports the other runner's."""
    from vllm_luce import hooks

    found, owns = [], {}
    for row in rows:
        if row.runner not in ("", hooks.V1, hooks.V2, hooks.V1_V2):
            found.append(f"{row.target}: runner {row.runner!r}")
        implied = runner_of_target(row.target)
        if implied and row.runner != implied:
            found.append(f"{row.target}: a {implied} target in a row of runner {row.runner or 'none'}")
        if re.match(r"(Model Runner )?V[12]\b", row.why):
            found.append(f"{row.target}: the why names the runner ({row.why[:20]}...); the column says it")
        modules = [o.split(":")[0] for o in row.owners]
        for module in modules:
            owns.setdefault(module, set()).add(row.runner)
        named = {runner_of_module(m) for m in modules}
        if row.runner in (hooks.V1, hooks.V2) and named != {row.runner}:
            found.append(f"{row.target}: a {row.runner} row with code in {', '.join(modules)} (name it *_"
                         f"{row.runner.lower()}.py)")
        elif row.runner not in (hooks.V1, hooks.V2) and None not in named and len(named) == 1:
            found.append(f"{row.target}: a row of runner {row.runner or 'none'} with code in {', '.join(modules)} only")
    for module, targets in sorted(graph.items()):
        runner = runner_of_module(module)
        if runner is None:
            continue
        if runner not in owns.get(module, set()) and not any(runner_of_module(m) == runner and module in graph[m]
                                                                for m in owns):
            found.append(f"{module}: named for {runner}, owns no {runner} row and serves no module that does")
        crossed = sorted(t for t in targets if runner_of_module(t) not in (None, runner))
        if crossed:
            found.append(f"{module}: a {runner} module imports {', '.join(crossed)}")
    return found


def test_a_binding_of_one_runner_says_so_in_its_name_and_its_row():
    from vllm_luce import hooks

    assert runner_breaches(hooks.HOOKS, module_imports(ROOT, "vllm_luce"), hooks.runner_of) == []
    assert {h.runner for h in hooks.HOOKS} == {"", hooks.V1, hooks.V2, hooks.V1_V2}


def test_the_runner_and_series_rules_catch_what_they_forbid(tmp_path):
    from vllm_luce import hooks
    from vllm_luce.hook_ledger import LedgerEntry

    (tmp_path / "vllm_luce" / "vllm026").mkdir(parents=True)
    for name, text in {"__init__.py": "", "vllm026/__init__.py": "", "vllm026/stash.py": "X = '0.26'\n",
                       "a.py": "from vllm_luce.compat import installed_series\nif installed_series() == '0.26':\n"
                               "    pass\nR = {'0.26': None}\n",
                       "b.py": "from vllm_luce.vllm026 import stash\n",
                       "c.py": "import importlib\nM = importlib.import_module('vllm_luce.vllm026.stash')\n",
                       "d.py": "import vllm\nT = {(0, 32): 1}[vllm.__version__]\n"}.items():
        (tmp_path / "vllm_luce" / name).write_text(text)
    found = series_branches(module_trees(tmp_path))
    assert [f.split(":")[0] for f in found] == ["vllm_luce.a line 2", "vllm_luce.a line 2", "vllm_luce.b line 1",
                                                "vllm_luce.c line 2", "vllm_luce.d line 2"], found

    def row(target, owners, remove_when, runner=None, why="w"):
        return hooks._row(hooks.INSTANCE_WRAP, target, owners, "f", why, "h", remove_when, runner=runner)

    old, later = "vllm-luce drops vLLM 0.26", "vLLM offers a hook"
    entry = LedgerEntry("vllm.x:Y.z", "(self)", "vllm_luce.patches.y", "w", "h", later,
                        per_series={"0.32": None, "0.33": None})
    assert len(off_the_package([row("vllm.x:A.b", "vllm_luce.spec_decode.stash:bind", old),
                                row("vllm.x:A.c", "vllm_luce.vllm026.stash:bind", later),
                                row("vllm.x:A.d", "vllm_luce.vllm026.stash:bind", old)],
                               [entry], ("0.26", "0.32", "0.33"))) == 3
    graph = {"vllm_luce.kvflash.worker_v1": {"vllm_luce.kvflash.worker_v2"}, "vllm_luce.kvflash.worker_v2": set(),
             "vllm_luce.kvflash.worker": set(), "vllm_luce.patches.lone_v2": set()}
    found = runner_breaches([row("vllm.v1.worker.gpu.x:A.b", "vllm_luce.kvflash.worker:bind", later),
                             row("vllm.v1.worker.gpu.x:A.c", "vllm_luce.kvflash.worker_v1:bind", later, runner="V1"),
                             row("vllm.x:A.d", "vllm_luce.kvflash.worker_v2:bind", later),
                             row("vllm.x:A.e", "vllm_luce.kvflash.worker:bind", later, why="V2: the same")],
                            graph, hooks.runner_of)
    # A.b's code, A.c's target, A.d's code, A.e's why, worker_v1's import, worker_v2 and lone_v2 owning no V2 row
    assert len(found) == 7, found
