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


def test_reask_script_asks_each_needle_and_lands_every_later_question_on_a_reselection(tok):
    schedule = list(range(40, 4000, 50))  # a stand-in for the pager's reselection steps
    case = N.make_reask_case(tok, list(heldout_files()), tokens=1024, depth=0.3, seed=2, others=2,
                             reselections=lambda p, n: schedule, filler_tokens=200)
    assert list(case.asks) == ["first", "other1", "other2", "again"]
    prompt = tok.decode(case.prompt_ids)
    assert prompt.endswith(f'KEY_{prompt.rsplit("KEY_", 1)[1]}') and prompt.count("KEY_") == 4
    assert tok.decode(case.prompt_ids[slice(*case.needle_tokens)]) == case.answers["first"] == case.answers["again"]
    free = [i for i, t in enumerate(case.script) if t == N.FREE]
    assert free == [i for at in case.asks.values() for i in range(at, at + N.NEEDLE_DIGITS)]
    for name, last in case.reselect_at.items():
        assert last in schedule and case.asks[name] == last + 1
        planted = prompt.split(f'{case.answers[name]}"')[0].rsplit("\n", 1)[1]  # 'KEY_<n> = "' of that needle
        assert tok.decode(case.script[last - 12 : last + 1]).endswith(f'\n{planted}')
    # the re-ask comes after at least the filler; the filler is held-out code without other keys
    between = case.script[case.asks["other2"] + N.NEEDLE_DIGITS : case.reselect_at["again"] + 1]
    assert len(between) >= 200 and tok.decode(between).count("KEY_") == 1
    assert len(case.script) == case.asks["again"] + N.NEEDLE_DIGITS


def test_reselection_outputs_follow_the_pagers_interval():
    from fixtures.reask import reselection_outputs
    from vllm_luce.kvflash.pager import PagerConfig

    steps = reselection_outputs(PagerConfig(pool_tokens=512), 2048, 300)
    # after the prompt-end reselection: at every multiple of the largest power of two up to max(16, position / 45)
    expected = []
    for i in range(300):
        interval = 1 << (max(16, (2048 + i) // 45).bit_length() - 1)
        if i > 0 and (2048 + i) % interval == 0:
            expected.append(i)
    assert steps == expected and steps[:2] == [32, 64]
