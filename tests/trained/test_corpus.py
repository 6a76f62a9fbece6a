"""The training corpus split and batches (fixtures/corpus.py)."""

import re

import numpy as np
import pytest

from fixtures import corpus as C
from fixtures.trained import trained_model

KEY_LINE = re.compile(r'KEY_(\d+) = "(\d+)"')


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(trained_model("tokenizer") / "tokenizer.json"))


@pytest.fixture(scope="module")
def tokens(tok):
    text = "".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(600))
    return C.encode_files(tok, [("a.py", text)])


def test_split_is_by_path_and_stable():
    paths = [f"pkg{i}/mod{i}.py" for i in range(5000)]
    held = [p for p in paths if C.is_heldout(p)]
    assert held == [p for p in paths if C.is_heldout(p)]
    assert 0.01 < len(held) / len(paths) < 0.03  # HELDOUT_PERMILLE = 20


def test_collect_filters_sizes_and_sorts(tmp_path):
    (tmp_path / "b").mkdir()
    for i in range(200):
        (tmp_path / "b" / f"m{i:03d}.py").write_text("x = 1\n" * 300)
    (tmp_path / "tiny.py").write_text("x = 1\n")  # under MIN_FILE_BYTES
    (tmp_path / "notes.txt").write_text("y\n" * 1000)  # not *.py
    corpus = C.collect(tmp_path)
    paths = [p for p, _ in corpus.train + corpus.heldout]
    assert "tiny.py" not in paths and "notes.txt" not in paths
    assert [p for p, _ in corpus.train] == sorted(p for p, _ in corpus.train)
    assert all(C.is_heldout(p) for p, _ in corpus.heldout) and corpus.heldout
    assert corpus.describe()["train_files"] + corpus.describe()["heldout_files"] == 200


def test_special_token_ids(tok):
    assert [tok.token_to_id(t) for t in C.SPECIAL_TOKENS] == [0, 1, 2, 3]


def test_batches_are_deterministic_by_seed(tok, tokens):
    a, b, c = (C.Batcher(tokens, tok, 256, seed).batch(4) for seed in (7, 7, 8))
    assert a.shape == (4, 256) and a.dtype == np.int32
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_planted_needles_repeat_with_the_same_digits(tok, tokens):
    batcher = C.Batcher(tokens, tok, 512, seed=0)
    seen = 0
    for _ in range(20):
        text = tok.decode(batcher._plant(tokens[:512]).tolist())
        values: dict[str, set[str]] = {}
        for key, digits in KEY_LINE.findall(text):
            values.setdefault(key, set()).add(digits)
        seen += len(values)
        assert all(len(v) == 1 for v in values.values()), values
        assert len(tok.encode(text).ids) >= 500  # windows keep their length (cut at the end)
    assert seen > 20


def test_repeated_spans_copy_earlier_tokens(tok, tokens):
    batcher = C.Batcher(tokens, tok, 512, seed=3)
    window = tokens[:512]
    out = batcher._repeat_spans(window)
    assert len(out) == 512 and not np.array_equal(out, window)
    # The window up to the first insertion is untouched.
    first_diff = int(np.flatnonzero(out != window)[0])
    assert np.array_equal(out[:first_diff], window[:first_diff])


def test_needle_probe_matches_the_test_prompts(tok, tokens):
    """The training-time probe asks what fixtures/needle.py asks: one planted 6-digit line,
    the query on the last line, the answer digits right after it."""
    cases = C.Batcher(tokens, tok, 512, seed=3).needle_probe(5)
    assert len(cases) == 5
    for seq, answer in cases:
        assert 0.8 * 512 <= len(seq) <= 512
        text = tok.decode(seq.tolist())
        digits = tok.decode(seq[answer].tolist())
        assert re.fullmatch(r"\d{6}", digits)
        (key, planted), = KEY_LINE.findall(text)  # the needle; the query has no closing quote
        assert planted == digits
        assert text.endswith(f'\nKEY_{key} = "{digits}')
    again = C.Batcher(tokens, tok, 512, seed=3).needle_probe(5)
    assert all((a == b).all() for (a, _), (b, _) in zip(cases, again))
