"""The documentation stays true to the code. Every list here is read from the code, never typed in:
README's configuration table against `vllm_luce/config.py`'s SCHEMA, docs/architecture.md's patch
ledger against `vllm_luce/patches/ledger.py`'s LEDGER, and examples/ against
tests/e2e/test_examples.py and README.

    python -m tests.test_docs --write-ledger   # regenerate docs/architecture.md's hook table and ledger section
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from vllm_luce.config import SCHEMA
from vllm_luce.patches import LEDGER

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
EXAMPLES_TEST = ROOT / "tests" / "e2e" / "test_examples.py"
LEDGER_BEGIN = "<!-- generated from vllm_luce/patches/ledger.py by `python -m tests.test_docs --write-ledger` -->"
LEDGER_END = "<!-- end of the generated ledger -->"
KEY_CELL = re.compile(r"`([a-z_<>]+)\.([a-z_]+)`")


def readme_config_rows() -> dict[tuple[str, str], list[str]]:
    """README's configuration table: {(section, key): [key, default, accepted] cells}."""
    lines = README.read_text().splitlines()
    start = lines.index("| key | default | accepted |")
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        match = KEY_CELL.fullmatch(cells[0])
        assert match and len(cells) == 3, f"README configuration row not `section.key` | default | accepted: {line}"
        rows[match.groups()] = cells
    return rows


SCHEMA_KEYS = [(section, key) for section, keys in SCHEMA.items() for key in keys]


@pytest.mark.parametrize("section,key", SCHEMA_KEYS, ids=[f"{s}.{k}" for s, k in SCHEMA_KEYS])
def test_readme_configuration_table_lists_the_key_with_its_default(section, key):
    rows = readme_config_rows()
    assert (section, key) in rows, f"README's configuration table has no row for `{section}.{key}`"
    _, default, accepted = rows[(section, key)]
    expected = f"`{json.dumps(SCHEMA[section][key].default)}`"  # as it is written in --additional-config
    assert default.startswith(expected), f"`{section}.{key}`: README default {default!r}, config.py {expected}"
    assert accepted, f"`{section}.{key}`: README gives no accepted values"


def test_readme_configuration_table_has_no_stale_keys():
    stale = [f"{s}.{k}" for s, k in readme_config_rows() if s != "<section>" and (s, k) not in SCHEMA_KEYS]
    assert not stale, f"README documents keys config.py does not define: {stale}"


def ledger_section() -> str:
    text = ARCHITECTURE.read_text()
    assert LEDGER_BEGIN in text and LEDGER_END in text, "docs/architecture.md lost its generated ledger markers"
    return text[text.index(LEDGER_BEGIN):text.index(LEDGER_END)]


def render_ledger() -> str:
    """The ledger section of docs/architecture.md: each patch's target, module, why, how, removal."""
    from vllm_luce.compat import SUPPORTED_SERIES

    parts = [LEDGER_BEGIN]
    for entry in LEDGER:
        series = [s if entry.signature_in(s) == entry.signature else
                  f"{s} (left alone)" if entry.signature_in(s) is None else f"{s} (its own signature)"
                  for s in SUPPORTED_SERIES]
        parts += ["", f"### `{entry.target}`", f"- **Module:** `{entry.module}`", f"- **vLLM:** {', '.join(series)}",
                  f"- **Why:** {entry.why}", f"- **How:** {entry.how}", f"- **Remove when:** {entry.remove_when}"]
    return "\n".join(parts) + "\n\n"


def test_architecture_lists_every_ledger_patch_and_no_other():
    documented = re.findall(r"^### `([^`]+)`$", ledger_section(), re.M)
    missing = [e.target for e in LEDGER if e.target not in documented]
    stale = [t for t in documented if t not in {e.target for e in LEDGER}]
    assert not missing and not stale, (f"docs/architecture.md's patch ledger is out of date (missing {missing}, "
                                       f"stale {stale}); run `python -m tests.test_docs --write-ledger`")


def example_files() -> list[Path]:
    files = sorted(p for p in (ROOT / "examples").iterdir() if p.suffix in (".py", ".sh"))
    assert files, "examples/ is empty"
    return files


def test_every_example_is_run_by_the_e2e_examples_test_and_listed_in_readme():
    from tests.e2e.test_examples import RUN_BY_ANOTHER

    run = set(re.findall(r'run_example\("([^"]+)"', EXAMPLES_TEST.read_text()))
    run |= {name for name, runner in RUN_BY_ANOTHER.items() if runner in run}
    readme = README.read_text()
    untested = [p.name for p in example_files() if p.name not in run]
    unlisted = [p.name for p in example_files() if f"`examples/{p.name}`" not in readme]
    assert not untested, f"examples not exercised by tests/e2e/test_examples.py: {untested}"
    assert not unlisted, f"examples missing from README's examples table: {unlisted}"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-ledger"]:
        sys.exit(__doc__)
    text = ARCHITECTURE.read_text()
    ledger_section()  # the markers must exist
    from tests.test_hooks import write_hooks

    text = write_hooks(text[:text.index(LEDGER_BEGIN)] + render_ledger() + text[text.index(LEDGER_END):])
    ARCHITECTURE.write_text(text)
    print(f"wrote the hook table and the patch ledger ({len(LEDGER)} patches) into {ARCHITECTURE.relative_to(ROOT)}")
