"""Fuzz the campaign config parser (t1ops/config.py: parse_config, load_toml).

Random dicts, one field of a valid config replaced by a value of the wrong
type or out of range, and random file contents must raise ConfigError naming
the dotted key (or the file), never another exception, never a coerced or
non-finite value; any valid config round-trips through a dict and TOML text.
"""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from t1ops.config_paths import INPUT_PATHS

from fuzz_common import FAST, SLOW_IO, json_values, only_t1ops_errors, wrong_values
from rl.errors import ConfigError
from t1ops.config import CampaignConfig, load_toml, parse_config
from toml_text import fields_of, to_toml, valid_sections, value_for

FIELDS = fields_of(CampaignConfig)  # (section, key, FieldInfo)


def _check_accepted(cfg: CampaignConfig) -> None:
    """An accepted config holds values of the declared types, in range, and round-trips."""
    assert parse_config(cfg.model_dump()) == cfg
    for section, key, _ in FIELDS:
        v = getattr(getattr(cfg, section), key)
        assert not (isinstance(v, float) and v != v) and v not in (float("inf"), float("-inf")), (section, key)


@FAST
@given(json_values | st.dictionaries(st.sampled_from([s for s, _, _ in FIELDS]), json_values, max_size=3))
def test_random_data_is_a_config_error_or_a_valid_config(data):
    with only_t1ops_errors(ConfigError) as caught:
        cfg = parse_config(data)
    if caught:
        assert re.search(r"invalid (campaign config|cluster plan|config)", str(caught[0])), caught[0]
    else:
        _check_accepted(cfg)


@FAST
@given(st.sampled_from(FIELDS), wrong_values | json_values)
@example(("run", "steps", None), "8")                  # numeric string: no coercion
@example(("run", "steps", None), True)                 # bool for an int
@example(("run", "steps", None), 8.0)                  # float for an int
@example(("guards", "stall_timeout_s", None), float("inf"))
@example(("trainer", "gamma", None), float("nan"))
@example(("run", "seed", None), -1)
def test_one_bad_field_names_its_dotted_key(field, value):
    section, key, _ = field
    with only_t1ops_errors(ConfigError) as caught:
        cfg = parse_config({section: {key: value}})
    if caught:
        assert f"{section}.{key}" in str(caught[0]), str(caught[0])  # a type/range or cross-field error
    else:
        _check_accepted(cfg)
        got = getattr(getattr(cfg, section), key)
        assert got == value and (type(got) is type(value) or (type(got), type(value)) == (float, int)), \
            f"{section}.{key}: {value!r} was accepted as {got!r}"


@FAST
@given(valid_sections(CampaignConfig))
def test_valid_configs_round_trip_through_dict_and_toml(data):
    with only_t1ops_errors(ConfigError) as caught:  # valid field by field; a cross-field rule may refuse
        cfg = parse_config(data)
    if caught:  # the refusal names a key of the data (no validator internals: t1ops.config_errors)
        assert any(k in str(caught[0]) for body in data.values() for k in body), caught[0]
        return
    assert parse_config(cfg.model_dump()) == cfg
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "campaign.toml"
        path.write_text(to_toml(data))
        loaded = load_toml(path).model_dump()
    # a file's input paths resolve against its directory (t1ops.config_paths): absolute once loaded
    expected = cfg.model_dump()
    for key in INPUT_PATHS:
        section, leaf = key.split(".")
        got, want = loaded[section].pop(leaf), expected[section].pop(leaf)
        assert not got or Path(got).is_absolute(), (key, got)  # "" is left to validation
        assert not want or not got or Path(got).name == Path(want).name, (key, got, want)
    assert loaded == expected


@SLOW_IO
@given(st.binary(max_size=120) | st.text(max_size=120).map(str.encode)
       | json_values.map(lambda v: to_toml({"run": {"name": v}}, strict=False).encode()))
@example(b"\xff\xfe[run]")
@example(b"[run]\nsteps = 1e999\n")
@example(b"[run]\n[run]\n")
def test_any_file_content_is_a_config_error_or_a_valid_config(content):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "campaign.toml"
        path.write_bytes(content)
        with only_t1ops_errors(ConfigError) as caught:
            cfg = load_toml(path)
        if caught:
            assert str(path) in str(caught[0])
        else:
            _check_accepted(cfg)


def test_a_directory_or_missing_file_is_a_config_error():
    with tempfile.TemporaryDirectory() as tmp:
        for path in (Path(tmp), Path(tmp) / "nope.toml"):
            with only_t1ops_errors(ConfigError) as caught:
                load_toml(path)
            assert caught and str(path) in str(caught[0])


@FAST
@given(st.sampled_from([f for f in FIELDS if value_for(f[2], out_of_range=True) is not None]), st.data())
def test_out_of_range_values_name_the_key_and_the_bound(field, data):
    section, key, info = field
    value = data.draw(value_for(info, out_of_range=True))
    with only_t1ops_errors(ConfigError) as caught:
        parse_config({section: {key: value}})
    assert caught and f"'{section}.{key}'" in str(caught[0]) and "allowed" in str(caught[0]), (value, caught)
