"""Signatures of vLLM functions read from their source text, the one form the ledger and the hook table record
(for a name that is no function: whether the release has it as a class, an attribute or a module).

The same reader serves the patch-time check (the installed vLLM's source of the function about to be
wrapped) and the snapshots of each supported vLLM release (``scripts/vllm_signatures.py`` reads the
PyPI wheels), so the two agree by construction: parameter names, kinds, annotations and defaults as
written, never as evaluated (evaluated annotations differ with import order and ``from __future__``).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path


def _format(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"({ast.unparse(node.args)}){returns}"


def of_function(function) -> str:
    """The signature of a live function (decorators unwrapped), from its source."""
    source = textwrap.dedent(inspect.getsource(inspect.unwrap(function)))
    node = ast.parse(source).body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise TypeError(f"{function!r} is not defined by a def statement")
    return _format(node)


def _definitions(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Top-level names of a module or class body: the last binding wins, as when Python runs it."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                names[alias.asname or alias.name] = node
    return names


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from`` import names, relative ones resolved against the importing module's package."""
    if not node.level:
        return node.module
    base = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


CLASS, ATTRIBUTE, MODULE = "class", "attribute", "module"  # what in_tree records for a target that is no function


def _assigned(scope: ast.AST, name: str) -> bool:
    """Whether a module or class body assigns ``name``, or a method of the class stores ``self.name``."""
    for node in scope.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    if not isinstance(scope, ast.ClassDef):
        return False
    for node in ast.walk(scope):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Attribute) and t.attr == name and isinstance(t.value, ast.Name)
               and t.value.id == "self" for t in _unpacked(targets)):
            return True
    return False


def _unpacked(targets: list[ast.expr]) -> list[ast.expr]:
    """Assignment targets with tuple and list targets (``self.a, b = ...``) and starred ones opened."""
    found: list[ast.expr] = []
    for target in targets:
        if isinstance(target, (ast.Tuple, ast.List)):
            found += _unpacked(list(target.elts))
        elif isinstance(target, ast.Starred):
            found += _unpacked([target.value])
        else:
            found.append(target)
    return found


def in_tree(root: Path, target: str, _depth: int = 0) -> str | None:
    """What ``module:Owner.name`` is in a source tree (a wheel's contents): a function's signature, ``CLASS``,
    ``ATTRIBUTE`` (assigned in the module or class body, or as ``self.name`` in a method of the class), ``MODULE``
    for a bare module, or None where the release lacks it. Follows ``from module import name [as alias]`` to the
    defining module, and a name a class inherits to the base class (named in the module or imported) that defines
    it."""
    if _depth > 16:
        raise RecursionError(f"import or base-class chain too long resolving {target}")
    module, _, qualname = target.partition(":")
    path, package = root / (module.replace(".", "/") + ".py"), module.rpartition(".")[0]
    if not path.exists():
        path, package = root / module.replace(".", "/") / "__init__.py", module
    if not path.exists():
        return None
    scope: ast.AST = ast.parse(path.read_text(encoding="utf-8"))
    if not qualname:
        return MODULE
    parts = qualname.split(".")
    for depth, part in enumerate(parts):
        node = _definitions(scope.body).get(part)
        if isinstance(node, ast.ImportFrom):
            alias = next(a for a in node.names if (a.asname or a.name) == part)
            rest = ".".join([alias.name, *parts[depth + 1:]])
            return in_tree(root, f"{_absolute(node, package)}:{rest}", _depth + 1)
        if node is None and depth == len(parts) - 1 and _assigned(scope, part):
            return ATTRIBUTE
        if node is None and isinstance(scope, ast.ClassDef):
            rest = ".".join(parts[depth:])
            for base in scope.bases:
                if isinstance(base, ast.Name):
                    found = in_tree(root, f"{module}:{base.id}.{rest}", _depth + 1)
                    if found is not None:
                        return found
            return None
        if node is None:
            return None
        scope = node
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return _format(scope)
    return CLASS if isinstance(scope, ast.ClassDef) else None


def imported_vllm_modules(package: Path) -> dict[str, set[str]]:
    """Each module of the package at ``package`` (its dotted name) -> the vLLM modules it imports, at its top or in a
    function: ``import vllm.x`` names ``vllm.x``, ``from vllm.x import y`` names ``vllm.x`` (the snapshots record
    whether each release has them)."""
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__")
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
        found[module] = {n for n in names if n == "vllm" or n.startswith("vllm.")}
    return found
