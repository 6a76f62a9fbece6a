"""The docs and the code's comments state what is true now; history stays in git.

- A comment or docstring in ``vllm_luce/`` names no commit (7-40 hex digits), no date, no figure measured on a
  device (a GPU model, or "measured on" / "profiled on", beside a time, ratio, share or rate) and no wording of the
  workplace that measured it: the figure belongs in a docs table with its provenance (device, vLLM version, date,
  commit, command), and the comment states the conclusion and points there.
- No paragraph, list item, table row or long sentence of the docs (README.md and docs/*.md) appears twice, on one
  page or two, whitespace, case and Markdown emphasis aside: each fact is kept in one place and linked to from the
  others. tests/test_docs.py compares whole paragraphs; this also finds one copied into a longer one, or copied
  and edited a little.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from tests.test_docs import paragraphs

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vllm_luce"
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# A commit id: 7-40 hex digits with at least one letter and one digit (a decimal number or a word is none), not part
# of a longer word, a path or a 0x literal.
COMMIT_ID = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
DATE = re.compile(rf"\b(?:19|20)\d\d[-/](?:0[1-9]|1[0-2])[-/](?:0[1-9]|[12]\d|3[01])\b"
                  rf"|\b(?:\d{{1,2}} )?(?:{MONTHS}) (?:\d{{1,2}}, )?(?:19|20)\d\d\b")
# A figure measured on a device: a sentence naming a GPU model, or saying it was measured or profiled, with a time,
# a ratio, a share or a rate. Computed sizes ("40 MB at Qwen3-8B's shape") and vLLM's own defaults are not measured.
DEVICE = re.compile(r"\b(?:[AHB]100|H200|B200|L40S?|MI\d{3}X?)\b|\b(?:measured|profiled) (?:on|through|in)\b", re.I)
FIGURE = re.compile(r"\d[\d.,]*\s*(?:ms|us|µs|s|x|×|%|GB/s|tok/s|tokens/s)(?!\w)")
# Words of the workplace that ran a measurement rather than of the code.
WORKPLACE = re.compile(r"\bthis session\b|\blent (?:GPU|machine|device|H\d00)s?\b|\bthe lab\b", re.I)
# Where a comment or docstring must name a commit, a date or a figure, allow it here: {(path, the matched text): why}.
ALLOWED: dict[tuple[str, str], str] = {}

MIN_REPEAT = 120  # characters, normalised: shorter runs (a name, a command, a short rule) may recur
SHINGLE, SIMILAR = 8, 0.6  # a unit whose 8-word runs are 60% in one other unit is a copy edited a little


def comment_texts(path: Path) -> list[tuple[int, str]]:
    """Every comment and docstring of a Python file as (first line, text)."""
    source = path.read_text()
    texts: list[tuple[int, str]] = []
    last = -1
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:  # a block of comment lines is one text
            if texts and tok.start[0] == last + 1:
                texts[-1] = (texts[-1][0], texts[-1][1] + "\n" + tok.string.lstrip("# "))
            else:
                texts.append((tok.start[0], tok.string.lstrip("# ")))
            last = tok.start[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                texts.append((first.lineno, first.value.value))
    return texts


def provenance_in_comments(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        where = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        for line, text in comment_texts(path):
            hits = [(m.start(), "commit id", m.group(0)) for m in COMMIT_ID.finditer(text)]
            hits += [(m.start(), "date", m.group(0)) for m in DATE.finditer(text)]
            hits += [(m.start(), "workplace wording", m.group(0)) for m in WORKPLACE.finditer(text)]
            offset = 0
            for sentence in re.split(r"(?<=[.;])\s+", text):
                start = text.index(sentence, offset)
                offset = start + len(sentence)
                if DEVICE.search(sentence) and FIGURE.search(sentence):
                    hits.append((start, "device figure", " ".join(sentence.split())[:80]))
            for start, kind, matched in hits:
                if (where, matched) not in ALLOWED:
                    at = line + text.count("\n", 0, start)
                    found.append(((where, at), f"{where}:{at}: {kind} {matched!r}"))
    return [message for _, message in sorted(found)]


def test_comments_and_docstrings_name_no_commit_date_device_figure_or_workplace():
    found = provenance_in_comments(sorted(PACKAGE.rglob("*.py")))
    assert not found, ("comments and docstrings in vllm_luce/ state conclusions; a measurement's commit and date "
                       "belong in its docs table (docs/benchmarks.md, docs/fidelity.md, docs/operations.md, "
                       "docs/gpu.md):\n" + "\n".join(found))


def test_the_provenance_rule_finds_commits_and_dates(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Measured at 9bd3fdb."""\n\nX = 0x7fffffff  # since 2026-11-28\n'
                      'Y = "deadbeef1"  # 1024 tokens (40 MB at Qwen3-8B\'s shape), sha256 of the path\n\n\n'
                      'def f():\n    """As of March 2026, see docs/data/gpu/tier_6fa1396_kvflash.json.\n\n'
                      '    Run on the lent GPUs: on an\n    H200 it took 17-20 s. Profiled on CPU: 2x faster."""\n'
                      '    return 1  # 8192 tokens, vLLM\'s default on H100/H200\n')
    found = provenance_in_comments([sample])
    assert sorted(f.split(": ", 1)[1] for f in found) == [
        "commit id '9bd3fdb'", "date '2026-11-28'", "date 'March 2026'",
        "device figure 'Profiled on CPU: 2x faster.'",
        "device figure 'Run on the lent GPUs: on an H200 it took 17-20 s.'", "workplace wording 'lent GPUs'"]


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

