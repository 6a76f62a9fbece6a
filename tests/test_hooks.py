"""vllm_luce/hooks.py's table against the code: every owner exists, every touch of a vLLM object in vllm_luce/
goes through the table's helpers (a source scan), every method of a vllm-luce class that overrides a vLLM method has
a row, and docs/vllm_touches.md's hook table is rendered from the table.

    python -m tests.test_docs --write-ledger   # regenerate the hook table and the patch ledger in the docs
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
import tomllib
from pathlib import Path

import pytest

from vllm_luce import hook_signatures, hooks
from vllm_luce.compat import SUPPORTED_SERIES
from vllm_luce.hook_ledger import LEDGER

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vllm_luce"
TOUCHES = ROOT / "docs" / "vllm_touches.md"
HOOKS_BEGIN = "<!-- generated from vllm_luce/hooks.py by `python -m tests.test_docs --write-ledger` -->"
HOOKS_END = "<!-- end of the generated hook table -->"

# The code that performs touches for the table (the helpers, and the patch tools they share with wrap_method).
MACHINERY = {"vllm_luce.hooks:bind", "vllm_luce.hooks:register", "vllm_luce.patches:wrap_method",
             "vllm_luce.patches:wrap_function", "vllm_luce.patches:_AfterImport.find_spec"}
# Local names that hold vllm-luce's own objects (attribute stores on them are no touch of vLLM).
OWN_OBJECTS = {
    ("vllm_luce.kvflash.runtime", "store"),  # PagedPoolStore
    ("vllm_luce.kvflash.runtime", "pager"),  # RequestPager / RequestSelection
    ("vllm_luce.kvflash.query_window", "pager"),  # RequestPager
    ("vllm_luce.spec_decode.gate", "r"),  # Regime
    ("vllm_luce.spec_decode.gate", "state"),  # the gate's per-request state
    ("vllm_luce.spec_decode.scheduler", "lookup"),  # GatedLookup
    ("vllm_luce.patches", "wrapper"),  # a patch's wrapper function
    ("vllm_luce.vllm026.context_stash_v2", "step"),  # PlainStep
}
REGISTRY_CALLS = {"register", "register_model", "_ensure_registered"}
NOT_VLLM = {"atexit", "os"}  # registries that are not vLLM's (atexit.register, os.register_at_fork)
LUCE_PREFIXES = ("luce_", "_luce_", "__luce_")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def vllm_facing_classes(trees: dict[str, ast.Module]) -> set[str]:
    """vllm-luce classes whose instances are vLLM objects: subclasses of a class imported from vLLM, and the
    mixins listed beside such a base (their ``self`` is the vLLM object)."""
    facing: set[str] = set()
    for tree in trees.values():
        from_vllm = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                     and (node.module or "").split(".")[0] == "vllm" for alias in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                if any(b in from_vllm for b in bases):
                    facing |= {node.name, *bases} - from_vllm
    return facing


def root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


class Scanner(ast.NodeVisitor):
    def __init__(self, module: str, facing: set[str]):
        self.module, self.facing = module, facing
        self.scope: list[tuple[str, str]] = []  # (kind, name): "class" or "def"
        self.found: list[str] = []

    def qualname(self) -> str:
        parts = []
        for i, (kind, name) in enumerate(self.scope):
            parts.append(name)
            if kind == "def" and i < len(self.scope) - 1:
                parts.append("<locals>")
        return ".".join(parts)

    def where(self, node) -> str:
        return f"{self.module}:{self.qualname() or '<module>'} line {node.lineno}"

    def enclosing_class(self) -> str | None:
        return next((name for kind, name in reversed(self.scope) if kind == "class"), None)

    def own(self, root: str | None) -> bool:
        if root in ("self", "cls"):
            return self.enclosing_class() not in self.facing
        return (self.module, root) in OWN_OBJECTS

    def in_machinery(self) -> bool:
        caller = f"{self.module}:{self.qualname()}"
        return self.module == "vllm_luce.hooks" or any(caller == m or caller.startswith(m + ".") for m in MACHINERY)

    def scoped(self, kind, node):
        self.scope.append((kind, node.name))
        self.generic_visit(node)
        self.scope.pop()

    def visit_ClassDef(self, node):
        self.scoped("class", node)

    def visit_FunctionDef(self, node):
        self.scoped("def", node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def store(self, target, node):
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.store(t, node)
        elif isinstance(target, ast.Attribute):
            if not target.attr.startswith(LUCE_PREFIXES) and not self.own(root_name(target.value)) \
                    and not self.in_machinery():
                self.found.append(f"{self.where(node)}: assigns .{target.attr} (use hooks.bind and a row)")
        elif isinstance(target, ast.Subscript) and (
                isinstance(target.value, ast.Attribute) and target.value.attr == "__dict__"
                or isinstance(target.value, ast.Call) and isinstance(target.value.func, ast.Name)
                and target.value.func.id == "vars"):
            key = target.slice.value if isinstance(target.slice, ast.Constant) else None
            if not (isinstance(key, str) and key.startswith(LUCE_PREFIXES)):
                self.found.append(f"{self.where(node)}: stores into __dict__")

    def visit_Assign(self, node):
        for target in node.targets:
            self.store(target, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self.store(node.target, node)
        self.generic_visit(node)

    visit_AnnAssign = visit_AugAssign

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and node.args:
            if not self.own(root_name(node.args[0])) and not self.in_machinery():
                self.found.append(f"{self.where(node)}: {func.id}() (use hooks.bind and a row)")
        elif isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__") and node.args \
                and not self.in_machinery():  # object.__setattr__(obj, name, value) and the like
            self.found.append(f"{self.where(node)}: .{func.attr}() (use hooks.bind and a row)")
        elif isinstance(func, ast.Attribute) and func.attr in ("update", "setdefault") \
                and isinstance(func.value, ast.Attribute) and func.value.attr == "__dict__":
            self.found.append(f"{self.where(node)}: __dict__.{func.attr}() (use hooks.bind and a row)")
        elif isinstance(func, ast.Attribute) and root_name(func) == "hooks" and func.attr in ("bind", "register"):
            self.check_helper_call(func.attr, node)
        elif isinstance(func, ast.Attribute) and (func.attr in REGISTRY_CALLS or func.attr.startswith("register_")) \
                and root_name(func) not in NOT_VLLM:
            self.found.append(f"{self.where(node)}: calls .{func.attr}() (use hooks.register and a row)")
        self.generic_visit(node)

    def check_helper_call(self, helper: str, node):
        caller = f"{self.module}:{self.qualname()}"
        kinds = (hooks.REGISTRY,) if helper == "register" else \
            (hooks.CLASS_PATH, hooks.SETTING, hooks.REBINDING, hooks.INSTANCE_WRAP)
        owns = lambda h: any(caller == o or caller.startswith(o + ".<locals>.") for o in h.owners)  # noqa: E731
        target = node.args[0] if node.args else None
        if isinstance(target, ast.Constant):
            row = next((h for h in hooks.HOOKS if h.target == target.value and h.kind in kinds), None)
            if row is None or not owns(row):
                self.found.append(f"{self.where(node)}: hooks.{helper}({target.value!r}) "
                                  f"{'has no row' if row is None else 'is not among the row owners'}")
        elif not any(owns(h) for h in hooks.HOOKS if h.kind in kinds):  # computed: checked when it runs
            self.found.append(f"{self.where(node)}: hooks.{helper}() from a function that owns no row")


def violations(extra: dict[str, str] | None = None) -> list[str]:
    trees = sources()
    trees.update({name: ast.parse(text) for name, text in (extra or {}).items()})
    facing = vllm_facing_classes(trees)
    found = []
    for module, tree in trees.items():
        scanner = Scanner(module, facing)
        scanner.visit(tree)
        found += scanner.found
    return found


def test_nothing_binds_to_vllm_outside_the_table():
    found = violations()
    assert not found, "touches of vLLM outside vllm_luce/hooks.py's table:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    "def bind(runner):\n    runner.execute_model = None\n",
    "def bind(runner):\n    setattr(runner, 'execute_model', None)\n",
    "def bind(sched):\n    sched.scheduler_cls = 'x.Y'\n",
    "from vllm.v1.core.sched.scheduler import Scheduler\nclass S(Scheduler):\n"
    "    def __init__(self):\n        self.dynamic_sd_lookup = {}\n",
    "def reg():\n    from vllm.model_executor.models import ModelRegistry\n    ModelRegistry.register_model('A', 'b:C')\n",
    "from vllm_luce import hooks\ndef stray(s):\n"
    "    hooks.bind('vllm.config.scheduler:SchedulerConfig.scheduler_cls', s, 'x.Y')\n",
    "from vllm_luce import hooks\ndef stray(s):\n    hooks.bind('vllm.config.scheduler:SchedulerConfig.nope', s, 1)\n",
    "def wrap(runner, f):\n    object.__setattr__(runner, 'execute_model', f)\n",
    "def wrap(runner, f):\n    vars(runner)['execute_model'] = f\n",
    "def wrap(runner, f):\n    runner.__dict__.update(execute_model=f)\n",
])
def test_the_scan_catches_a_touch_outside_the_table(source):
    assert violations({"vllm_luce.probe": source})


def test_the_helpers_refuse_targets_without_a_row_and_callers_that_do_not_own_it():
    class Obj:
        pass

    with pytest.raises(hooks.HookNotInTable, match="not in vllm_luce/hooks.py's table"):
        hooks.bind("vllm.config.scheduler:SchedulerConfig.nope", Obj(), 1)
    with pytest.raises(hooks.HookNotInTable, match="gives to vllm_luce.spec_decode.install:install_gate"):
        hooks.bind("vllm.config.scheduler:SchedulerConfig.scheduler_cls", Obj(), "x.Y")
    with pytest.raises(hooks.HookNotInTable, match="not a registry"):
        hooks.register("vllm.v1.request:Request.spec_token_ids")


def test_bind_refuses_a_method_replaced_through_a_row_that_is_no_instance_wrap():
    class Request:
        def spec_token_ids(self):
            pass

    owner = {"__name__": "vllm_luce.spec_decode.scheduler", "hooks": hooks}  # the row's owner, re-created
    exec("class DFlashGateMixin:\n    def schedule(self, request, value):\n"
         "        hooks.bind('vllm.v1.request:Request.spec_token_ids', request, value)\n", owner)
    owner["DFlashGateMixin"]().schedule(type("Plain", (), {"spec_token_ids": [1]})(), [])  # a list: bound
    with pytest.raises(hooks.HookNotInTable, match="make its row an instance wrap"):
        owner["DFlashGateMixin"]().schedule(Request(), [])


def test_every_row_is_well_formed_and_its_owners_exist():
    assert len({(h.kind, h.target, h.owners) for h in hooks.HOOKS}) == len(hooks.HOOKS)
    bindable = [h.target for h in hooks.HOOKS if h.kind in (hooks.CLASS_PATH, hooks.SETTING, hooks.REBINDING,
                                                             hooks.INSTANCE_WRAP)]
    assert len(bindable) == len(set(bindable)), "one row per bound target (list its owners in the row)"
    for h in hooks.HOOKS:
        assert h.kind in hooks.KINDS and h.owners and h.feature and h.why and h.how and h.remove_when, h
        for owner in h.owners:
            assert hooks.resolve(owner) is not None, owner
        if h.kind == hooks.PATCH:
            assert h.ledger is not None and h.ledger.target == h.target and h.stage, h.target
            assert callable(getattr(hooks.resolve(h.owners[0]), "apply", None)) or h.stage == hooks.SCHEDULER_START
        if h.kind == hooks.FEATURE:
            assert len(h.owners) == 1 and callable(h.function()) and h.stage, h


def test_a_method_rebound_on_an_instance_is_an_instance_wrap_with_its_signature_checked():
    """What a bound target is in vLLM 0.32 decides its kind: a method is wrapped (the row checks its signature in
    every release), anything else is a rebinding or a setting."""
    for h in hooks.HOOKS:
        if h.kind in (hooks.CLASS_PATH, hooks.SETTING, hooks.REBINDING, hooks.INSTANCE_WRAP) and h.target in h.checks:
            is_method = hook_signatures.EXPECTED[h.target].startswith("(")
            assert is_method == (h.kind == hooks.INSTANCE_WRAP), f"{h.target}: a {h.kind} row"


# Names a class body holds that no one writes (the compiler's) or that are vllm-luce's own.
NOT_OVERRIDES = {"__module__", "__qualname__", "__doc__", "__firstlineno__", "__static_attributes__"}


def body_names(cls: type) -> list[str]:
    """The names a class's own source defines (methods, class attributes), not those a decorator generates."""
    node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    names = [n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    names += [t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
    names += [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    return [n for n in names if n not in NOT_OVERRIDES and not n.startswith(LUCE_PREFIXES)]


def is_vllm(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "vllm"


def overrides(cls: type, own=lambda c: c.__module__.startswith("vllm_luce.")) -> set[tuple[str, str]]:
    """(owner, vLLM name) for each name a class of ``cls``'s MRO that ``own`` accepts defines over a vLLM class's:
    the owner is "module:Class.name", the vLLM name the one on the vLLM class ``cls`` subclasses first (mixins
    included: their methods override what the class they are mixed into inherits)."""
    mro = cls.__mro__
    base = next((c for c in mro if is_vllm(c)), None)
    found = set()
    for i, mine in enumerate(mro):
        if base is None or not own(mine):
            continue
        for name in body_names(mine):
            definer = next((c for c in mro[i + 1:] if not own(c) and name in vars(c)), None)
            if definer is not None and is_vllm(definer):
                found.add((f"{mine.__module__}:{mine.__qualname__}.{name}",
                           f"{base.__module__}:{base.__qualname__}.{name}"))
    return found


def vllm_luce_classes() -> list[type]:
    """Every module-level class of the modules in vllm_luce/ that import from vLLM."""
    classes = []
    for module, tree in sources().items():
        if any(isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "vllm" for n in ast.walk(tree)):
            names = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
            if names:
                imported = importlib.import_module(module)
                classes += [getattr(imported, name) for name in names]
    return classes


def recorded_overrides(rows=hooks.HOOKS) -> set[tuple[str, str]]:
    """(owner, vLLM name) pairs the table records: override rows, and the patch row whose override runs in
    vllm-luce's scheduler classes (owned by its module)."""
    return {(owner, name) for h in rows if h.kind in (hooks.OVERRIDE, hooks.PATCH) for owner in h.owners
            for name in h.checks}


def unrecorded(found: set[tuple[str, str]], recorded: set[tuple[str, str]]) -> list[str]:
    return sorted(f"{owner} overrides {name}" for owner, name in found
                  if (owner, name) not in recorded and (owner.partition(":")[0], name) not in recorded)


@pytest.fixture(scope="module")
def every_override() -> set[tuple[str, str]]:
    return {pair for cls in vllm_luce_classes() for pair in overrides(cls)}


def test_every_override_of_a_vllm_method_has_a_row(every_override):
    missing = unrecorded(every_override, recorded_overrides())
    assert not missing, "vLLM methods overridden without a row in vllm_luce/hook_overrides.py:\n" + "\n".join(missing)
    assert len(every_override) > 30  # the scan sees the schedulers, the KV cache spec and manager, the executors


def test_every_override_row_is_an_override_the_code_makes(every_override):
    made = {owner for owner, _ in every_override}
    for h in hooks.rows(hooks.OVERRIDE):
        (owner,) = h.owners
        assert owner in made and {n for o, n in every_override if o == owner} == set(h.checks), h.target


def test_the_override_scan_catches_an_override_without_a_row():
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

    class ProbeMixin:
        def schedule(self):
            pass

    class ProbeManager(ProbeMixin, FullAttentionManager):
        luce_state = None  # vllm-luce's own

        def free(self, request_id):
            pass

        def probe_helper(self):  # no vLLM method of that name
            pass

    found = overrides(ProbeManager, own=lambda c: c.__module__ == __name__)
    assert {name.rsplit(".", 1)[1] for _, name in found} == {"free"}  # FullAttentionManager has no schedule
    assert unrecorded(found, recorded_overrides())
    row = hooks._row(hooks.OVERRIDE, "x", [o for o, _ in found], "f", "w", "h", "r", checks=[n for _, n in found])
    assert not unrecorded(found, recorded_overrides([row]))


def test_every_ledger_patch_has_one_row():
    assert [h.target for h in hooks.rows(hooks.PATCH)] == [e.target for e in LEDGER]


def test_the_plugin_entry_point_is_the_table_s():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (row,) = [h for h in hooks.rows(hooks.REGISTRY) if h.target.startswith("entry point")]
    plugins = pyproject["project"]["entry-points"]["vllm.general_plugins"]
    assert row.target == f"entry point vllm.general_plugins: {', '.join(plugins)}"
    assert list(plugins.values()) == list(row.owners)


def checked(name: str) -> str:
    """A name a row checks, with what the supported releases have there where it is not the same in each."""
    entry = next((e for e in LEDGER if e.target == name), None)
    if entry is not None:
        seen = {s: entry.signature_in(s) for s in SUPPORTED_SERIES}
        what, differs = "signature", [f"{s} {'left alone' if v is None else 'its own'}" for s, v in seen.items()
                                      if v != entry.signature]
    else:
        seen = {s: hook_signatures.expected_in(name, s) for s in SUPPORTED_SERIES}
        value = hook_signatures.EXPECTED[name]
        what = "signature" if value.startswith("(") else value
        differs = [f"{s} {'absent' if v is None else 'its own'}" for s, v in seen.items() if v != value]
    return f"`{name}` ({what}{'; ' if differs else ''}{', '.join(differs)})"


def render_hooks() -> str:
    """docs/vllm_touches.md's hook table: one line per row of vllm_luce/hooks.py, then each row's how, removal
    condition and checked names."""
    def short(path: str) -> str:
        return path.removeprefix("vllm_luce.")

    def cell(text: str) -> str:
        return text.replace("|", "/")

    lines = [HOOKS_BEGIN, "", "| # | vLLM target | kind | runner | feature | owner in vllm-luce | why |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for i, h in enumerate(hooks.HOOKS, 1):
        why = h.why
        if h.kind == hooks.PATCH:
            why += f" (applied {h.stage}; ledger below)" if h.stage != hooks.SCHEDULER_START else f" ({h.stage})"
        elif h.stage:
            why += f" (runs {h.stage})"
        owners = ", ".join(f"`{short(o)}`" for o in h.owners)
        lines.append(f"| {i} | `{h.target}` | {h.kind} | {h.runner or '-'} | {h.feature} | {owners} | {cell(why)} |")
    counts = ", ".join(f"{sum(h.kind == k for h in hooks.HOOKS)} {k}" for k in hooks.KINDS)
    runners = ", ".join(f"{sum(h.runner == r for h in hooks.HOOKS)} {r}" for r in (hooks.V1, hooks.V2, hooks.V1_V2))
    lines += ["", f"{len(hooks.HOOKS)} rows: {counts}.", "",
              f"Runner: the vLLM model runner whose objects the row binds ({runners}): V1 is "
              "`vllm/v1/worker/gpu_model_runner.py` and the CPU runner built on it, V2 is Model Runner V2 "
              "(`vllm/v1/worker/gpu/`); - for a touch outside the runners. A row of one runner has its code in a module "
              "named `*_v1.py` or `*_v2.py`, and what both runners' bindings share is in the module of the same name "
              "without it (tests/test_layout.py). The rows whose removal condition names vLLM 0.26 have their code in "
              "`vllm_luce/vllm026/`, and deleting that package with them is how vLLM 0.26 support goes.", "",
              "### How, when to remove, what is checked", "",
              f"Checked: each name in the snapshot of vLLM {', '.join(SUPPORTED_SERIES)}; a series named in brackets "
              "has its own signature there, lacks the name, or is left alone by the patch.", "",
              "| # | how | remove when | checked |", "| --- | --- | --- | --- |"]
    for i, h in enumerate(hooks.HOOKS, 1):
        how, remove = ("the ledger below",) * 2 if h.kind == hooks.PATCH else (h.how, h.remove_when)
        lines.append(f"| {i} | {cell(how)} | {cell(remove)} | {'<br>'.join(checked(n) for n in h.checks)} |")
    names = {n for h in hooks.HOOKS for n in h.checks}
    lines += ["", f"{len(names)} vLLM names checked in each of vLLM {', '.join(SUPPORTED_SERIES)}.", ""]
    return "\n".join(lines) + "\n"


def hooks_section(text: str) -> tuple[int, int]:
    assert HOOKS_BEGIN in text and HOOKS_END in text, "docs/vllm_touches.md lost its generated hook table markers"
    return text.index(HOOKS_BEGIN), text.index(HOOKS_END)


def write_hooks(text: str) -> str:
    begin, end = hooks_section(text)
    return text[:begin] + render_hooks() + text[end:]


def test_the_hook_table_page_is_rendered_from_the_table():
    text = TOUCHES.read_text()
    begin, end = hooks_section(text)
    assert text[begin:end] == render_hooks(), ("docs/vllm_touches.md's hook table is out of date; run "
                                               "`python -m tests.test_docs --write-ledger`")
