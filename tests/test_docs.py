"""The documentation stays true to the code. Every list here is read from the code, never typed in:
docs/reference.md's configuration, metrics and compatibility tables are generated from
`vllm_luce/config.py`'s SCHEMA, `vllm_luce/metrics/catalog.py`'s CATALOG and `vllm_luce/compat.py`;
docs/vllm_touches.md's hook table and patch ledger from `vllm_luce/hooks.py` and `vllm_luce/hook_ledger.py`;
examples/ are checked against tests/e2e/test_examples.py and README.

    python -m tests.test_docs --write-ledger   # regenerate every generated section (reference, hook table, ledger)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from vllm_luce.config import SCHEMA
from vllm_luce.hook_ledger import LEDGER

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
TOUCHES = ROOT / "docs" / "vllm_touches.md"  # the hook table and the patch ledger, generated
ARCHITECTURE_MAX_LINES = 300
REFERENCE = ROOT / "docs" / "reference.md"
EXAMPLES_TEST = ROOT / "tests" / "e2e" / "test_examples.py"
LEDGER_BEGIN = "<!-- generated from vllm_luce/hook_ledger.py by `python -m tests.test_docs --write-ledger` -->"
LEDGER_END = "<!-- end of the generated ledger -->"


def generated_markers(name: str) -> tuple[str, str]:
    return (f"<!-- generated: {name}, by `python -m tests.test_docs --write-ledger` -->",
            f"<!-- end of generated: {name} -->")


def md_cell(text: str) -> str:
    return text.replace("|", "/")


def render_configuration() -> str:
    """Every key of SCHEMA: section by section, its default as --additional-config writes it, what it accepts."""
    from vllm_luce.config import ENV_PREFIX

    parts = []
    for section, keys in SCHEMA.items():
        parts += ["", f"### `{section}` settings", "",
                  "| key | default | accepted | what it does | environment variable |", "| --- | --- | --- | --- | --- |",
                  f"| `{section}.enabled` | `false`; `true` once the section appears | true or false | "
                  f"the feature on or off | `{ENV_PREFIX}{section.upper()}` |"]
        for key, spec in keys.items():
            parts.append(f"| `{section}.{key}` | `{json.dumps(spec.default)}` | {md_cell(spec.accepted)} | "
                         f"{md_cell(spec.help)} | `{ENV_PREFIX}{section.upper()}_{key.upper()}` |")
    return "\n".join(parts) + "\n\n"


def render_metrics() -> str:
    """Every metric of the catalog as /metrics shows it (counters with Prometheus' `_total`)."""
    from vllm_luce.metrics.catalog import CATALOG, PREFIX

    parts = ["", "| metric | type | labels (besides `model_name`) | meaning |", "| --- | --- | --- | --- |"]
    for name, (kind, labels, meaning) in CATALOG.items():
        shown = PREFIX + name + ("_total" if kind == "counter" else "")
        parts.append(f"| `{shown}` | {kind} | {', '.join(f'`{label}`' for label in labels)} | {md_cell(meaning)} |")
    return "\n".join(parts) + "\n\n"


def render_compatibility() -> str:
    """The supported vLLM series, what pip installs, and where each is run and how the patches apply there."""
    from vllm_luce import __version__
    from vllm_luce.compat import RUN_HERE, SNAPSHOT_RELEASES, SUPPORTED_SERIES, supported_range

    parts = ["", f"vllm-luce {__version__} supports vLLM {', '.join(s + '.x' for s in SUPPORTED_SERIES)}; "
             f"the `vllm` extra (`pip install '.[vllm]'` in a checkout) installs `vllm{supported_range()}`.", "",
             "| vLLM series | signature snapshot | patches (own signature / left alone) | run here |",
             "| --- | --- | --- | --- |"]
    for series, release in zip(SUPPORTED_SERIES, SNAPSHOT_RELEASES):
        own = sum(e.signature_in(series) not in (None, e.signature) for e in LEDGER)
        alone = sum(e.signature_in(series) is None for e in LEDGER)
        parts.append(f"| {series}.x | `tests/patches/vllm_signatures/{release}.json` | {len(LEDGER)} ({own} / {alone}) "
                     f"| {md_cell(RUN_HERE[series])} |")
    return "\n".join(parts) + "\n\n"


GENERATED = {"configuration": render_configuration, "metrics": render_metrics, "compatibility": render_compatibility}


def write_generated(text: str) -> str:
    for name, render in GENERATED.items():
        begin, end = generated_markers(name)
        assert begin in text and end in text, f"docs/reference.md lost its generated {name} markers"
        text = text[:text.index(begin) + len(begin)] + "\n" + render() + text[text.index(end):]
    return text


@pytest.mark.parametrize("name", GENERATED)
def test_reference_section_is_generated_from_the_code(name):
    text = REFERENCE.read_text()
    begin, end = generated_markers(name)
    assert begin in text and end in text, f"docs/reference.md lost its generated {name} markers"
    assert text[text.index(begin) + len(begin):text.index(end)] == "\n" + GENERATED[name](), (
        f"docs/reference.md's {name} section is out of date; run `python -m tests.test_docs --write-ledger`")


SCHEMA_KEYS = [(section, key) for section, keys in SCHEMA.items() for key in keys]


@pytest.mark.parametrize("section,key", SCHEMA_KEYS, ids=[f"{s}.{k}" for s, k in SCHEMA_KEYS])
def test_reference_lists_the_key_with_its_default_and_what_it_does(section, key):
    row = re.search(rf"^\| `{section}\.{key}` \| `([^`]*)` \| (.+?) \| (.+?) \|", REFERENCE.read_text(), re.M)
    assert row, f"docs/reference.md has no row for `{section}.{key}`"
    assert row.group(1) == json.dumps(SCHEMA[section][key].default)
    assert SCHEMA[section][key].help, f"`{section}.{key}` has no help text in vllm_luce/config.py"


DOC_PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MIN_PARAGRAPH = 80
LIST_ITEM = re.compile(r"^\s*(?:[-*]|\d+\.) ")


def paragraphs(text: str) -> list[str]:
    """The prose of a Markdown page: blocks between blank lines, each list item on its own, whitespace
    collapsed; tables, code blocks, headings and HTML comments left out."""
    out, block, fenced = [], [], False

    def close():
        if block:
            out.append(" ".join(" ".join(block).split()))
            block.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            close()
            fenced = not fenced
            continue
        if fenced or not stripped or stripped.startswith(("|", "#", "<!--")):
            close()
            continue
        if LIST_ITEM.match(line):
            close()
        block.append(stripped)
    close()
    return out


def test_paragraph_splitting():
    text = "# T\n\nOne two\nthree.\n\n```\ncode\n```\n| a | b |\n- item one\n  goes on\n- item two\n"
    assert paragraphs(text) == ["One two three.", "- item one goes on", "- item two"]


def test_no_paragraph_is_printed_twice():
    seen: dict[str, str] = {}
    repeated = []
    for page in DOC_PAGES:
        for paragraph in paragraphs(page.read_text()):
            key = re.sub(r"[`*_]", "", LIST_ITEM.sub("", paragraph)).lower()  # Markdown emphasis and case ignored
            if len(key) < MIN_PARAGRAPH:
                continue
            where = str(page.relative_to(ROOT))
            if key in seen:
                repeated.append(f"{seen[key]} and {where}: {key[:100]}...")
            seen.setdefault(key, where)
    assert not repeated, "paragraphs printed twice (keep one, link to it from the other):\n" + "\n".join(repeated)


def test_every_docs_page_named_in_the_docs_exists():
    named = {(page.name, m) for page in DOC_PAGES
             for m in re.findall(r"(?<![\w/.])(?:docs/)?([a-z_]+\.md)\b", page.read_text()) if m != "README.md"}
    missing = sorted(f"{page}: {m}" for page, m in named if not (ROOT / "docs" / m).exists())
    assert not missing, f"pages named in the docs that docs/ does not have: {missing}"


def ledger_section() -> str:
    text = TOUCHES.read_text()
    assert LEDGER_BEGIN in text and LEDGER_END in text, "docs/vllm_touches.md lost its generated ledger markers"
    return text[text.index(LEDGER_BEGIN):text.index(LEDGER_END)]


def render_ledger() -> str:
    """The ledger section of docs/vllm_touches.md: each patch's target, module, why, how, removal, and the drafted
    upstream issue where it has one."""
    from vllm_luce.compat import SUPPORTED_SERIES

    parts, drafted = [LEDGER_BEGIN], {}
    for entry in LEDGER:
        series = [s if entry.signature_in(s) == entry.signature else
                  f"{s} (left alone)" if entry.signature_in(s) is None else f"{s} (its own signature)"
                  for s in SUPPORTED_SERIES]
        parts += ["", f"### `{entry.target}`", f"- **Module:** `{entry.module}`", f"- **vLLM:** {', '.join(series)}",
                  f"- **Why:** {entry.why}", f"- **How:** {entry.how}", f"- **Remove when:** {entry.remove_when}"]
        issue = entry.upstream_issue
        if issue is not None and id(issue) in drafted:  # one issue for a target that moved between releases
            parts.append(f"- **Upstream issue (draft):** the one of `{drafted[id(issue)]}`")
        elif issue is not None:
            drafted[id(issue)] = entry.target
            parts += [f"- **Upstream issue (draft):** {issue.title}", f"  - Symptom: {issue.symptom}",
                      f"  - Cause: {issue.cause}", f"  - Proposed fix: {issue.fix}"]
    return "\n".join(parts) + "\n\n"


def test_the_ledger_page_is_rendered_from_the_ledger():
    assert ledger_section() == render_ledger(), (
        "docs/vllm_touches.md's patch ledger is out of date; run `python -m tests.test_docs --write-ledger`")


def test_architecture_is_short_and_links_the_generated_hook_page():
    text = ARCHITECTURE.read_text()
    assert len(text.splitlines()) <= ARCHITECTURE_MAX_LINES, "docs/architecture.md: move detail to its own page"
    assert "vllm_touches.md" in text


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
    REFERENCE.write_text(write_generated(REFERENCE.read_text()))
    print(f"wrote the configuration, metrics and compatibility tables into {REFERENCE.relative_to(ROOT)}")
    text = TOUCHES.read_text()
    ledger_section()  # the markers must exist
    from tests.test_hooks import write_hooks

    text = write_hooks(text[:text.index(LEDGER_BEGIN)] + render_ledger() + text[text.index(LEDGER_END):])
    TOUCHES.write_text(text)
    print(f"wrote the hook table and the patch ledger ({len(LEDGER)} patches) into {TOUCHES.relative_to(ROOT)}")
