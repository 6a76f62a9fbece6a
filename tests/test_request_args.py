"""The per-request switches clients send in vllm_xargs: strict at the engine client, lenient in the core."""

from types import SimpleNamespace

import pytest

from vllm_luce import request_args as R


def params(**extra):
    return SimpleNamespace(extra_args=extra or None)


@pytest.mark.parametrize("value", ["off", "OFF ", "false", "no", "0", False, 0])
def test_off_values_decline(value):
    assert R.declined(params(luce_dflash=value), R.DFLASH)
    R.check(params(luce_dflash=value))


@pytest.mark.parametrize("value", ["on", "true", "Yes", "1", True, 1])
def test_on_values_do_not_decline(value):
    assert not R.declined(params(luce_pflash=value), R.PFLASH)
    R.check(params(luce_pflash=value))


def test_absent_switches_and_other_keys_are_left_alone():
    for p in (params(), params(other="x"), SimpleNamespace(), None):
        assert not R.declined(p, R.DFLASH)
        R.check(p)
    assert not R.declined(params(luce_pflash="off"), R.DFLASH)


@pytest.mark.parametrize("key", R.SWITCHES)
@pytest.mark.parametrize("value", ["of", "disable", 2, None, 0.5])
def test_a_bad_value_is_an_error_naming_the_key(key, value):
    with pytest.raises(ValueError, match=rf'vllm_xargs\.{key}: got .*; expected "on" or "off"'):
        R.check(params(**{key: value}))
    assert not R.declined(params(**{key: value}), key)


def test_the_error_is_vllms_validation_error_so_its_servers_answer_400():
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError):
        R.check(params(luce_dflash="maybe"))
