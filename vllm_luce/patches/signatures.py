"""Signatures of vLLM functions read from their source text, the one form the ledger records.

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
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = node
    return names


def in_tree(root: Path, target: str, _depth: int = 0) -> str | None:
    """The signature of ``module:Owner.name`` in a source tree (a wheel's contents), or None where the
    release lacks it. Follows ``from module import name [as alias]`` to the defining module, and a
    method a class inherits to the base class (named in the module or imported) that defines it."""
    if _depth > 16:
        raise RecursionError(f"import or base-class chain too long resolving {target}")
    module, _, qualname = target.partition(":")
    path = root / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = root / module.replace(".", "/") / "__init__.py"
    if not path.exists():
        return None
    scope: ast.AST = ast.parse(path.read_text(encoding="utf-8"))
    parts = qualname.split(".")
    for depth, part in enumerate(parts):
        node = _definitions(scope.body).get(part)
        if isinstance(node, ast.ImportFrom):
            alias = next(a for a in node.names if (a.asname or a.name) == part)
            rest = ".".join([alias.name, *parts[depth + 1:]])
            return in_tree(root, f"{node.module}:{rest}", _depth + 1)
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
    return None
