"""The docs state what is true now, each fact once; history stays in git (the code's comments and docstrings:
tests/test_comments.py).

- No paragraph, list item, table row or long sentence of the docs (README.md and docs/*.md) appears twice, on one
  page or two, whitespace, case and Markdown emphasis aside: each fact is kept in one place and linked to from the
  others. tests/test_docs.py compares whole paragraphs; this also finds one copied into a longer one, or copied
  and edited a little.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_docs import paragraphs

ROOT = Path(__file__).resolve().parents[1]
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

MIN_REPEAT = 120  # characters, normalised: shorter runs (a name, a command, a short rule) may recur
SHINGLE, SIMILAR = 8, 0.6  # a unit whose 8-word runs are 60% in one other unit is a copy edited a little

LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")
SENTENCE_END = re.compile(r"(?<=[.;!?])\s+(?=\S)")


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[`*_]", "", LIST_ITEM.sub("", text)).lower().split())


def table_rows(text: str) -> list[str]:
    """A Markdown page's table rows, normalised; tables' header rows and rules, and code blocks, left out."""
    out: list[str] = []
    fenced, header = False, None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
        elif not fenced and stripped.startswith("|"):
            if set(stripped) <= set("|-: "):
                if out and out[-1] == header:
                    out.pop()  # a table's header row: column names recur from table to table
            else:
                header = normalise(stripped)
                out.append(header)
    return out


def units(text: str) -> list[str]:
    """A Markdown page's paragraphs and list items (``test_docs.paragraphs``) and table rows, normalised."""
    return [normalise(paragraph) for paragraph in paragraphs(text)] + table_rows(text)


def shingles(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[\w.%×/+-]+", text)
    return {tuple(words[k:k + SHINGLE]) for k in range(len(words) - SHINGLE + 1)}


def repeats(pages: dict[str, str]) -> list[str]:
    """Each unit of at least MIN_REPEAT characters that also occurs elsewhere (on its page or another): a sentence of
    it found inside another unit, or, for prose, most of its runs of SHINGLE words found in one other prose unit (a
    copy edited a little). Table rows count only as they are: the rows of one table share most of their words."""
    everything = [(name, unit) for name, text in pages.items() for unit in units(text)]
    prose = [not unit.startswith("|") for _, unit in everything]
    runs = [shingles(unit) if is_prose else set() for (_, unit), is_prose in zip(everything, prose)]
    index: dict[tuple[str, ...], set[int]] = {}
    for k, unit_runs in enumerate(runs):
        for run in unit_runs:
            index.setdefault(run, set()).add(k)
    found = []
    for k, (name, unit) in enumerate(everything):
        if len(unit) < MIN_REPEAT:
            continue
        others = set()
        for piece in (p for p in {unit, *SENTENCE_END.split(unit)} if len(p) >= MIN_REPEAT):
            others |= {j for j, (_, u) in enumerate(everything) if j != k and piece in u}
        shared: dict[int, int] = {}
        for run in runs[k]:
            for j in index[run] - {k}:
                shared[j] = shared.get(j, 0) + 1
        others |= {j for j, n in shared.items() if n >= SIMILAR * len(runs[k])}
        if others:
            where = ", ".join(sorted({everything[j][0] for j in others}))
            found.append(f"{name} and {where}: {unit[:110]}...")
    return found


def test_no_paragraph_is_repeated_across_the_docs():
    pages = {str(page.relative_to(ROOT)): page.read_text() for page in DOC_PAGES}
    found = repeats(pages)
    assert not found, ("text repeated in the docs (keep it in one place and link to it from the other):\n"
                       + "\n".join(found))


def test_the_repeat_rule_finds_a_paragraph_copied_into_another_page():
    fact = ("KVFlash pages a request's cold chunks to host memory and brings the ones its policy selects back "
            "into the pool before the step that reads them, so that a request's KV stays within its pool however "
            "long its context grows.")
    pages = {"a.md": f"# A\n\n{fact}\n",
             "b.md": f"# B\n\n- Something else first. {fact.replace(' ', chr(10), 3)} And more.\n",
             "c.md": "# C\n\n| a short | table |\n| --- | --- |\n| row | row |\n"}
    found = repeats(pages)
    assert len(found) == 2 and found[0].startswith("a.md and b.md") and found[1].startswith("b.md and a.md")
    assert not repeats({"a.md": pages["a.md"], "c.md": pages["c.md"]})
    edited = fact.replace("the step that reads", "the engine step that reads")
    assert [f[:12] for f in repeats({"a.md": pages["a.md"], "d.md": f"# D\n\n{edited}\n"})] == ["a.md and d.m",
                                                                                            "d.md and a.m"]

