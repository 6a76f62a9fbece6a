"""Needle prompts (fixtures/needle.py)."""

import re

import pytest

from fixtures import needle as N
from fixtures.trained import heldout_files, trained_model


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(trained_model("tokenizer"))


@pytest.mark.parametrize("tokens", [512, 2048])
def test_case_shape(tok, tokens):
    case = N.make_case(tok, list(heldout_files()), tokens=tokens, depth=0.5, seed=0)
    assert case.prompt.count("KEY_") == 2  # the needle and the query
    key = case.prompt.rsplit("\n", 1)[1]
    assert key.startswith("KEY_") and key.endswith(' = "')
    assert f'{key}{case.answer}"\n' in case.prompt
    assert 0.9 * tokens <= case.prompt_tokens <= tokens
    assert len(case.answer) == N.NEEDLE_DIGITS and case.answer.isdigit()


def test_depth_moves_the_needle_and_cases_repeat(tok):
    files = list(heldout_files())
    spots = []
    for depth in (0.0, 0.5, 1.0):
        case = N.make_case(tok, files, tokens=1024, depth=depth, seed=1)
        spots.append(case.prompt.index(f'"{case.answer}"') / len(case.prompt))
        assert case == N.make_case(tok, files, tokens=1024, depth=depth, seed=1)
    assert spots[0] < 0.1 < spots[1] < 0.9 < spots[2]
    with pytest.raises(ValueError, match="depth"):
        N.make_case(tok, files, tokens=1024, depth=1.5, seed=1)


def test_retrieved():
    case = N.NeedleCase("p", "123456", 0.5, 10)
    assert N.retrieved(case, '123456"\n')
    assert not N.retrieved(case, "1234567")
    assert not N.retrieved(case, '12345"')


def test_distractor_needles_are_planted_with_other_keys_and_the_query_asks_for_the_first(tok):
    files = list(heldout_files())
    single = N.make_case(tok, files, tokens=1024, depth=0.5, seed=3)
    assert single == N.make_case(tok, files, tokens=1024, depth=0.5, seed=3, distractors=0)
    multi = N.make_case(tok, files, tokens=1024, depth=0.5, seed=3, distractors=2)
    keys = re.findall(r'^KEY_(\d+) = "(\d{6})"$', multi.prompt, flags=re.M)
    asked = multi.prompt.rsplit("\n", 1)[1]
    assert len(keys) == 3 and len({k for k, _ in keys}) == 3
    assert asked == f'KEY_{keys[[d for _, d in keys].index(multi.answer)][0]} = "' and multi.answer == single.answer
    assert abs(multi.prompt_tokens - 1024) < 40
