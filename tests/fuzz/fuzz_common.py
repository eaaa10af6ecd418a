"""Shared strategies and checks for the parser fuzzers in ``tests/fuzz``.

The property every fuzzer asserts: malformed outside data raises a
:class:`~rl.errors.T1OpsError` subclass whose message names the problem,
never another exception type, and valid data round-trips.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Any, Iterator

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from rl.errors import T1OpsError

#: Modest example counts: the whole directory runs in well under a minute on 2 shared cores.
FAST = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SLOW_IO = settings(max_examples=20, deadline=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))

#: Any value ``json.loads`` can produce (NaN/Infinity included: Python's json accepts them).
json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)

#: Values of a wrong kind for a field that expects something specific.
wrong_values = (st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True)
                | st.text(max_size=5) | st.lists(st.integers(), max_size=2) | st.just({"x": 1}))


def paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key/index path inside a JSON-like value (the root excluded)."""
    out: list[tuple] = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        out.extend(paths(v, prefix + (k,)))
    return out


def mutate(obj: Any, path: tuple, value: Any, delete: bool) -> Any:
    """A deep copy of ``obj`` with ``path`` replaced by ``value`` (or removed when ``delete``)."""
    new = copy.deepcopy(obj)
    parent = new
    for k in path[:-1]:
        parent = parent[k]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return new


@st.composite
def mutations(draw, obj: Any, values=json_values) -> tuple[tuple, Any, bool]:
    """(path, replacement, delete?) for one random edit of ``obj``."""
    path = draw(st.sampled_from(paths(obj)))
    delete = draw(st.booleans())
    return path, (None if delete else draw(values)), delete


@contextmanager
def only_t1ops_errors(*allowed: type[T1OpsError]) -> Iterator[list]:
    """Let a call succeed or raise one of ``allowed``; any other exception fails the test.

    The yielded list receives the caught error, so the caller can check its message.
    """
    caught: list = []
    try:
        yield caught
    except allowed as err:  # noqa: PERF203 - the point of the helper
        assert str(err).strip(), f"{type(err).__name__} with an empty message"
        caught.append(err)
    except T1OpsError as err:
        raise AssertionError(f"expected one of {[c.__name__ for c in allowed]}, got "
                             f"{type(err).__name__}: {err}") from err


def names_one_of(err: BaseException, *words: str) -> bool:
    """True when the error message names at least one of ``words`` (a field, key or path)."""
    msg = str(err)
    return any(w in msg for w in words)
