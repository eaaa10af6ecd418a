"""Fuzz plan files (t1ops/preflight: load_plan, then check_plan on whatever loads).

A plan file is written by hand or generated: random bytes, random TOML, one
field of a shipped plan replaced by a wrong type or an out-of-range value must
raise ConfigError naming the file and the dotted key. A plan that loads is
within every declared range, round-trips through TOML, and ``check_plan``
answers it with a verdict (it refuses bad layouts, it never crashes).
"""
from __future__ import annotations

import re
import tempfile
import tomllib
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from fuzz_common import FAST, SLOW_IO, json_values, only_t1ops_errors, wrong_values
from rl.errors import ConfigError
from t1ops.preflight import check_plan, load_plan
from t1ops.preflight.plan import Plan
from toml_text import fields_of, to_toml, value_for

PLANS = sorted((Path(__file__).resolve().parents[2] / "examples" / "plans").glob("*.toml"))
SHIPPED = {p.stem: tomllib.loads(p.read_text()) for p in PLANS}
FIELDS = fields_of(Plan)


def _load_text(text: str | bytes) -> tuple[list, Plan | None, Path]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.toml"
        path.write_bytes(text.encode() if isinstance(text, str) else text)
        plan = None
        with only_t1ops_errors(ConfigError) as caught:
            plan = load_plan(path)
        if caught:
            assert str(path) in str(caught[0]), str(caught[0])
        return caught, plan, path


def _check_loaded(plan: Plan) -> None:
    """A loaded plan round-trips and gets a verdict from every check."""
    caught, back, _ = _load_text(to_toml(plan.model_dump()))
    assert not caught and back == plan
    report = check_plan(plan, name="fuzz")
    assert report.verdict in ("ok", "warn", "refuse")


def _with(name: str, section: str, key: str, value) -> dict:
    data = {s: dict(body) for s, body in SHIPPED[name].items()}
    data.setdefault(section, {})[key] = value
    return data


def test_shipped_plans_load_and_round_trip():
    assert PLANS, "no shipped plans found"
    for p in PLANS:
        _check_loaded(load_plan(p))


@SLOW_IO
@given(st.binary(max_size=150) | st.text(max_size=150)
       | json_values.map(lambda v: to_toml({"parallelism": {"tp": v}}, strict=False)))
@example(b"\xc3\x28")                               # invalid UTF-8
@example("[model]\nnum_layers = 48\n[model]\n")     # duplicate table
@example("[parallelism]\ntp = inf\n")
def test_random_file_content_is_a_config_error(content):
    caught, plan, _ = _load_text(content)
    if not caught:
        _check_loaded(plan)


@SLOW_IO
@given(st.sampled_from(sorted(SHIPPED)), st.sampled_from(FIELDS),
       (wrong_values | json_values).filter(lambda v: v is not None))  # TOML has no null
@example("qwen35-122b-56gpu", ("parallelism", "tp", None), "2")
@example("qwen35-122b-56gpu", ("hardware", "gpu_memory_gib", None), float("inf"))
@example("qwen35-122b-56gpu", ("precision", "full_recompute", None), 1)
@example("qwen35-122b-56gpu", ("parallelism", "train_gpus", None), 2**31)    # check_plan looped over 2**31 EPs
@example("qwen35-122b-56gpu", ("hardware", "gpu_memory_gib", None), 1e300)  # check_plan overflowed
def test_one_wrong_value_names_its_dotted_key(name, field, value):
    section, key, _ = field
    caught, plan, _ = _load_text(to_toml(_with(name, section, key, value), strict=False))
    if caught:
        # a type/range error names the dotted key; a cross-field rule names the fields it relates
        assert key in str(caught[0]) or "not valid TOML" in str(caught[0]), str(caught[0])
    else:
        got = getattr(getattr(plan, section), key)
        assert got == value and (type(got) is type(value) or (type(got), type(value)) == (float, int)), \
            f"{section}.{key}: {value!r} was accepted as {got!r}"


@FAST
@given(st.sampled_from(sorted(SHIPPED)),
       st.sampled_from([f for f in FIELDS if value_for(f[2], out_of_range=True) is not None]), st.data())
def test_out_of_range_values_name_the_key_and_the_bound(name, field, data):
    section, key, info = field
    value = data.draw(value_for(info, out_of_range=True))
    caught, _, _ = _load_text(to_toml(_with(name, section, key, value)))
    assert caught and f"'{section}.{key}'" in str(caught[0]), (value, caught)


@SLOW_IO
@given(st.sampled_from(sorted(SHIPPED)), st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3), st.data())
@example("qwen35-122b-56gpu", [("model", "hidden_size", None)], None)
@example("qwen35-122b-56gpu", [("parallelism", "etp", None)], None)  # pp*etp > train_gpus: no EP fits
def test_in_range_values_load_or_name_the_conflict_and_always_get_a_verdict(name, fields, data):
    plan_dict = {s: dict(body) for s, body in SHIPPED[name].items()}
    for section, key, info in fields:
        if data is None:  # the explicit examples: a huge hidden size, an etp larger than the GPUs
            value = 2**40 if key == "hidden_size" else 33
        else:
            value = data.draw(value_for(info), label=f"{section}.{key}")
        if value is not None:
            plan_dict.setdefault(section, {})[key] = value
    caught, plan, _ = _load_text(to_toml(plan_dict))
    if caught:  # a cross-field rule (divisibility, top-k <= experts, sample <= wall)
        assert re.search(r"invalid (campaign config|cluster plan|config)", str(caught[0])), caught[0]
    else:
        _check_loaded(plan)
