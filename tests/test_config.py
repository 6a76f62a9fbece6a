import pytest

from vllm_luce.config import AUTO_POOL_TOKENS, RESOLVED_KEY, SCHEMA, LuceConfig, LuceConfigError


def build(luce=None, environ=None):
    additional = None if luce is None else {"luce": luce}
    return LuceConfig.from_sources(additional, environ or {})


def test_every_feature_is_off_by_default():
    config = build()
    assert config.active == []
    assert config.describe() == "none"
    assert set(config.features) == set(SCHEMA)
    assert config.kvflash.chunk_tokens == 64


def test_an_empty_section_switches_its_feature_on_with_the_defaults():
    config = build({"kvflash": {}})
    assert [f.name for f in config.active] == ["kvflash"]
    defaults = {key: spec.default for key, spec in SCHEMA["kvflash"].items()}
    assert config.kvflash.settings == {**defaults, "pool_tokens": AUTO_POOL_TOKENS}  # 'auto' resolved
    assert config.kvflash.auto == {"pool_tokens"}


def test_other_additional_config_keys_are_not_ours():
    assert LuceConfig.from_sources({"gdn_prefill_backend": "auto"}, {}).active == []


@pytest.mark.parametrize("luce, message", [
    ({"kvflsh": {}}, "unknown key 'kvflsh'; accepted keys: dflash, kvflash, pflash"),
    ({"kvflash": {"pool_tokenz": 1}}, "luce.kvflash.pool_tokenz: unknown key 'pool_tokenz'; accepted keys for kvflash: enabled, pool_tokens"),
    ({"kvflash": {"pool_tokens": 0}}, "luce.kvflash.pool_tokens: got 0; expected a positive integer or 'auto'"),
    ({"kvflash": {"pool_tokens": -64}}, "got -64"),
    ({"kvflash": {"pool_tokens": 4096.5}}, "got 4096.5; expected a positive integer"),
    ({"kvflash": {"pool_tokens": True}}, "got True"),
    ({"kvflash": {"chunk_tokens": 48}}, "expected a power of two in [16, 1024]"),
    ({"kvflash": {"policy": "random"}}, "expected one of 'lru', 'qk', 'bounds', 'salient', 'scorer'"),
    ({"kvflash": {"host_pinned_bytes": -1}}, "luce.kvflash.host_pinned_bytes: got -1; expected an integer >= 0 (bytes of host memory each worker pins for paged-out KV at startup) or 'auto'"),
    ({"pflash": {"keep_ratio": 0}}, "luce.pflash.keep_ratio: got 0; expected a number in (0, 1]"),
    ({"pflash": {"keep_ratio": "0.1"}}, "got '0.1'"),
    ({"dflash": {"gate": "yes"}}, "luce.dflash.gate: got 'yes'; expected true or false"),
    ({"dflash": 3}, "luce.dflash: got 3; expected a JSON object"),
    ({"dflash": {"enabled": "maybe"}}, "expected true or false"),
])
def test_bad_values_name_the_key_the_value_and_what_is_accepted(luce, message):
    with pytest.raises(LuceConfigError) as error:
        build(luce)
    assert message in str(error.value)


def test_luce_must_be_an_object():
    with pytest.raises(LuceConfigError, match="expected a JSON object"):
        LuceConfig.from_sources({"luce": "kvflash"}, {})


def test_enabling_a_feature_that_has_not_landed_stops_startup(monkeypatch):
    import vllm_luce.config as C

    monkeypatch.setattr(C, "AVAILABLE_FEATURES", frozenset({"dflash", "kvflash"}))
    with pytest.raises(LuceConfigError, match="luce.pflash: pflash is not available"):
        build({"pflash": {"drafter": "/models/d"}})


@pytest.mark.parametrize("settings,message", [
    ({"keep_curve": [[8192, 0.2], [4096, 0.1]]}, "luce.pflash.keep_curve: got [[8192, 0.2], [4096, 0.1]]"),
    ({"keep_curve": [[8192, 1.5]]}, "prompt_tokens increasing, ratios in (0, 1]"),
    ({"keep_curve": "8192:0.2"}, "a list of [prompt_tokens, keep_ratio] pairs"),
    ({"pool_kernel": 12}, "luce.pflash.pool_kernel: got 12; expected an odd integer"),
    ({"attention": "flash"}, "one of 'auto', 'dense', 'sparse'"),
    ({"dtype": "fp8"}, "one of 'auto', 'bfloat16', 'float16', 'float32'"),
    ({"lookahead_tokens": 0}, "an integer in [1, 256]"),
    ({"tail_chunks": 0}, "luce.pflash.tail_chunks: got 0"),
])
def test_bad_pflash_settings_name_the_key(settings, message):
    with pytest.raises(LuceConfigError) as error:
        build({"pflash": {"drafter": "/d", **settings}})
    assert message in str(error.value)


def test_pflash_settings_reach_the_cores():
    from vllm_luce.pflash.settings import scoring_config, selection_config

    pf = build({"pflash": {"drafter": "/d", "keep_curve": [[8192, 0.2], [65536, 0.05]],
                           "early_exit_layers": 7, "pre_rope": False}}).pflash
    assert selection_config(pf).ratio_for(8192) == 0.2 and selection_config(pf).chunk_tokens == 32
    assert scoring_config(pf).early_exit_layers == 7 and not scoring_config(pf).pre_rope


def test_disabled_sections_are_validated_but_inactive():
    config = build({"kvflash": {"enabled": False, "pool_tokens": 4096}, "pflash": False})
    assert config.active == []
    assert config.kvflash.pool_tokens == 4096
    with pytest.raises(LuceConfigError, match="got 0"):
        build({"kvflash": {"enabled": False, "pool_tokens": 0}})


def test_environment_is_parsed_and_additional_config_wins():
    environ = {"VLLM_LUCE_KVFLASH": "0", "VLLM_LUCE_KVFLASH_POOL_TOKENS": "2048",
               "VLLM_LUCE_KVFLASH_POLICY": "lru", "VLLM_LUCE_PFLASH_KEEP_RATIO": "0.25",
               "VLLM_LUCE_PFLASH_ENABLED": "false", "VLLM_LUCE_EXECUTORS": "auto",
               "VLLM_LUCE_VENV": "/opt/venv"}  # scripts/setup.sh's, not the plugin's
    config = build({"kvflash": {"policy": "qk"}}, environ)
    assert config.kvflash.pool_tokens == 2048  # from the environment
    assert config.kvflash.policy == "qk"  # additional-config overrides the environment
    assert config.pflash.keep_ratio == 0.25
    assert config.active == []


def test_bad_environment_values_name_the_variable():
    with pytest.raises(LuceConfigError, match="VLLM_LUCE_KVFLASH_CHUNK_TOKENS: got 100"):
        build(environ={"VLLM_LUCE_KVFLASH_CHUNK_TOKENS": "100", "VLLM_LUCE_KVFLASH": "off"})
    with pytest.raises(LuceConfigError, match="unknown environment variable VLLM_LUCE_KVFLAHS_POOL"):
        build(environ={"VLLM_LUCE_KVFLAHS_POOL": "1"})


@pytest.mark.parametrize("value, message", [
    (100, None), ("auto", None), (0, "a positive integer or 'auto'"), (-64, "a positive integer"),
    (64.0, "a positive integer"), (True, "a positive integer"), ("4k", "a positive integer"),
])
def test_kvflash_pool_tokens_values(value, message):
    if message is None:
        kv = build({"kvflash": {"pool_tokens": value}}).kvflash
        assert kv.pool_tokens == (AUTO_POOL_TOKENS if value == "auto" else value)
        assert kv.auto == ({"pool_tokens"} if value == "auto" else set())
    else:
        with pytest.raises(LuceConfigError, match=f"luce.kvflash.pool_tokens: got .*expected {message}"):
            build({"kvflash": {"pool_tokens": value}})


def test_kvflash_pool_checks_against_the_chunk_and_the_floor():
    from vllm_luce.kvflash.pager import KVFlashConfigError
    from vllm_luce.kvflash.plan import build_plan

    assert build_plan(build({"kvflash": {}}).kvflash).pager.pool_tokens == AUTO_POOL_TOKENS
    with pytest.raises(KVFlashConfigError, match="pool_tokens: got 100; expected a positive multiple of chunk_tokens"):
        build_plan(build({"kvflash": {"pool_tokens": 100}}).kvflash)
    with pytest.raises(KVFlashConfigError, match="expected at least 768"):  # 1 sink + 4 recent + 1, of 128
        build_plan(build({"kvflash": {"pool_tokens": 512, "chunk_tokens": 128}}).kvflash)


@pytest.mark.parametrize("chunk, pool", [(16, 4096), (64, 4096), (1024, 4096)])
def test_auto_pool_is_whole_chunks(chunk, pool):
    assert build({"kvflash": {"chunk_tokens": chunk}}).kvflash.pool_tokens == pool


class _VllmConfig:
    def __init__(self, additional_config):
        self.additional_config = additional_config


def test_settings_resolved_once_reach_every_process_as_attached(monkeypatch):
    """The first process attaches what it resolved; a process that receives the VllmConfig reads that, not its own
    environment (a worker on another node may have another)."""
    monkeypatch.setenv("VLLM_LUCE_KVFLASH_CHUNK_TOKENS", "128")
    first = _VllmConfig({"luce": {"kvflash": {"recent_chunks": 6}}})
    resolved = LuceConfig.from_vllm_config(first)
    resolved.attach(first)
    monkeypatch.setenv("VLLM_LUCE_KVFLASH_CHUNK_TOKENS", "32")
    received = LuceConfig.from_vllm_config(first)
    assert received == resolved
    assert (received.kvflash.chunk_tokens, received.kvflash.recent_chunks, received.kvflash.pool_tokens) == (128, 6, 4096)
    assert received.kvflash.auto == {"pool_tokens"}
    import json

    json.dumps(first.additional_config)  # vLLM hashes additional_config as JSON


def test_the_resolved_form_keeps_whether_a_feature_was_given():
    """DFlash is on when vLLM speculates with it unless the user's config said otherwise: the attached form must keep
    'not given' apart from 'given and off'."""
    for luce, on_when_used in ((None, True), ({"dflash": False}, False), ({"dflash": {"gate": True}}, True)):
        config = build(luce)
        again = LuceConfig.from_plain(config.to_plain())
        assert again == config and again.dflash.on_when_used() is on_when_used


@pytest.mark.parametrize("mangle, message", [
    (lambda p: p.pop("pflash"), "one entry per feature"),
    (lambda p: p["kvflash"]["settings"].update(pool_tokens=-1), "luce_resolved'.kvflash.pool_tokens: got -1"),
    (lambda p: p["kvflash"]["settings"].pop("chunk_tokens"), "kvflash: expected enabled, given, auto and settings"),
    (lambda p: p.update(kvflash=None), "kvflash: expected enabled"),
])
def test_a_mangled_resolved_form_names_what_is_wrong(mangle, message):
    plain = build({"kvflash": {}}).to_plain()
    mangle(plain)
    with pytest.raises(LuceConfigError, match=message):
        LuceConfig.from_vllm_config(_VllmConfig({RESOLVED_KEY: plain}))
