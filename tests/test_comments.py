"""Comments state conclusions: a comment or docstring says what is true of the code as it stands, never its history.

Every comment, docstring and other string statement of the Python files under ``SCOPE`` (read with ``tokenize``:
code strings and data are not read) names

- no commit: 7-40 hex digits with at least one digit and one letter a-f, standing alone (``COMMIT_ID``);
- no date, ISO or with a month's name (``DATE``);
- no wording of the workplace that ran something: a session or stop by its number or as the current or last one,
  the machines it lends and their kind names (``WORKPLACE``);
- no figure measured on a machine: a sentence naming a device (a GPU or CPU model, a CI or development host, "this
  machine", "measured on") beside a time, a ratio, a share or a rate (``DEVICE`` with ``FIGURE``). A device alone
  is a fact (a kernel tuned for an H200), and so is a figure alone (a computed size, a setting's default).

A measurement's figure, commit and date belong in its docs table or in docs/data/, with its provenance; the comment
states the conclusion it supports ("a scoring pass inside the engine loop held every request behind it") and points
there. Data is out of this rule's reach: hashes in test assets, digests, signature snapshots, tuning tables keyed by
device name, and what a benchmark records at run time (its device and commit) are code, not comments.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCOPE = ("vllm_luce", "tests", "benchmarks", "scripts", "examples", "fixtures", "testenv")

# 7-40 hex digits with a letter and a digit (a decimal number or a word like "deadbeef" or "facade" is none), not
# joined to a word, a path, a file name or a 0x literal (``tier_6fa1396.json`` names a data file, not history).
COMMIT_ID = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/-])(?!\.\w)")
MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
DATE = re.compile(rf"\b(?:19|20)\d\d[-/](?:0[1-9]|1[0-2])[-/](?:0[1-9]|[12]\d|3[01])\b"
                  rf"|\b(?:\d{{1,2}} )?(?:{MONTHS}) (?:\d{{1,2}}, )?(?:19|20)\d\d\b")
# The workplace: its sessions and stops, the machines it lends and their kind names. pytest's "session" scope
# ("built once per session") is the test run's, not the workplace's, and stays allowed.
WORKPLACE = re.compile(r"\b(?:this|last|previous|earlier|next|that) session\b|\bsessions? \d+\b|\bstop \d+\b"
                       r"|\blent (?:GPU|machine|device|host|H\d00)s?\b|\bthe lab\b|\bdevice calls?\b"
                       r"|\bnvidia-[a-z]\d+\w*", re.I)
# A sentence names where it was measured: a GPU or CPU model, a host of CI or development, this machine, or says
# it was measured or profiled on something.
DEVICE = re.compile(r"\b(?:[AHBV]100|[GH]H?200|GB200|B200|A10G?|L40S?|L4|T4|RTX ?\d{4}|MI\d{3}X?|EPYC|Xeon)\b"
                    r"|\b(?:CI|development|dev|build) (?:hosts?|machines?|box|environment|runners?)\b"
                    r"|\bthis (?:machine|host|CPU|GPU|box)\b|\b\d+-core\b"
                    r"|\b(?:measured|profiled|timed) (?:on|through|in)\b", re.I)
# A measured figure: a time, a ratio ("1.73x"; "64 x 128" is a shape), a share or a rate.
FIGURE = re.compile(r"\d[\d.,]*(?:x|×|\s*(?:ms|us|µs|ns|s|sec|seconds?|min|minutes?|hours?|%|[GMT]i?B/s|tok/s"
                    r"|tokens/s|req/s))(?!\w)")
SENTENCE_END = re.compile(r"(?<=[.;!?])\s+")
# A string literal's prefix and quotes, taken off its text; the text keeps the source's lines.
QUOTES = re.compile(r"^[rRbBuU]*(?:\"\"\"|\'\'\'|\"|\')|(?:\"\"\"|\'\'\'|\"|\')$")


def comment_texts(source: str) -> list[tuple[int, str]]:
    """Every comment and string statement (docstrings among them) of Python ``source`` as (first line, text); a run
    of comments on consecutive lines is one text."""
    texts: list[tuple[int, str]] = []
    last_comment = -1
    statement: list[tokenize.TokenInfo] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if texts and tok.start[0] == last_comment + 1 and last_comment > 0:
                texts[-1] = (texts[-1][0], texts[-1][1] + "\n" + text)
            else:
                texts.append((tok.start[0], text))
            last_comment = tok.start[0]
        elif tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if statement and all(t.type == tokenize.STRING for t in statement):  # a statement of strings only
                texts.append((statement[0].start[0], "\n".join(QUOTES.sub("", t.string) for t in statement)))
            statement = []
        elif tok.type not in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING):
            statement.append(tok)
    return texts


def hits(text: str) -> list[tuple[int, str, str]]:
    """(offset in ``text``, kind, matched text) of every commit id, date, workplace wording and device figure."""
    found = [(m.start(), "commit id", m.group(0)) for m in COMMIT_ID.finditer(text)]
    found += [(m.start(), "date", m.group(0)) for m in DATE.finditer(text)]
    found += [(m.start(), "workplace wording", m.group(0)) for m in WORKPLACE.finditer(text)]
    offset = 0
    for sentence in SENTENCE_END.split(text):
        start = text.index(sentence, offset)
        offset = start + len(sentence)
        if DEVICE.search(sentence) and FIGURE.search(sentence):
            found.append((start, "device figure", " ".join(sentence.split())[:80]))
    return found


def history_in_comments(files: list[Path]) -> list[str]:
    """The hits as ``path:line: kind 'text'``."""
    found = []
    for path in files:
        where = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        for line, text in comment_texts(path.read_text()):
            for start, kind, matched in hits(text):
                at = line + text.count("\n", 0, start)
                found.append(((where, at), f"{where}:{at}: {kind} {matched!r}"))
    return [message for _, message in sorted(found)]


def scoped_files() -> list[Path]:
    return sorted(p for folder in SCOPE for p in (ROOT / folder).rglob("*.py"))


def test_comments_and_docstrings_state_conclusions_not_history():
    found = history_in_comments(scoped_files())
    assert not found, ("comments and docstrings state what is true now: no commit, date, workplace wording or figure "
                       "measured on a device. State the conclusion; a measurement's provenance belongs in its docs "
                       "table (docs/benchmarks.md, docs/fidelity.md, docs/operations.md, docs/gpu.md) or "
                       "docs/data/:\n" + "\n".join(found))


def test_the_rule_finds_what_it_forbids(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Measured at 9bd3fdb."""\n\nX = 0x7fffffff  # since 2026-11-28\n'
        'Y = "deadbeef1 on an H200 took 3.1 s"  # 1024 tokens (40 MB at Qwen3-8B\'s shape), sha256 of the path\n'
        'Z = 1  # see docs/data/gpu/tier_6fa1396.json and tier_6fa1396_kvflash.json\n'
        '# the comment goes on: stop 65 set it\n\n\n'
        'def f():\n    """As of March 2026.\n\n'
        '    Run on the lent GPUs: on an\n    H200 it took 17-20 s. Profiled on CPU: 2x faster."""\n'
        '    "A string statement: the CI host passed it in 0.5 s (session 37)."\n'
        '    return g(1, "on an H100 at abc1234 it took 95 s")  # 8192 tokens, vLLM\'s default on H100/H200\n'
        '\n\nclass C:\n    """Built once per session; a kernel tuned for the H200, its block 64 x 128."""\n')
    found = history_in_comments([sample])
    assert sorted(f.split(": ", 1)[1] for f in found) == [
        "commit id '9bd3fdb'", "date '2026-11-28'", "date 'March 2026'",
        "device figure 'A string statement: the CI host passed it in 0.5 s (session 37).'",
        "device figure 'Profiled on CPU: 2x faster.'",
        "device figure 'Run on the lent GPUs: on an H200 it took 17-20 s.'",
        "workplace wording 'lent GPUs'", "workplace wording 'session 37'", "workplace wording 'stop 65'"]
    assert [f.split(": ", 1)[0] for f in found if "stop 65" in f] == [f"{sample}:6"]  # the line of the hit
