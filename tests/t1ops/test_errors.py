"""Every T1OpsError subclass also subclasses a builtin and survives pickling (errors cross Ray)."""
from __future__ import annotations

import inspect
import pickle

import rl.errors as errors_mod
from t1ops.errors import T1OpsError


def _subclasses():
    return [c for _, c in inspect.getmembers(errors_mod, inspect.isclass)
            if issubclass(c, T1OpsError) and c is not T1OpsError]


def test_hierarchy_is_rooted_and_builtin_backed():
    subs = _subclasses()
    assert len(subs) >= 20
    for cls in subs:
        builtin_bases = [b for b in cls.__mro__ if b.__module__ == "builtins" and b not in (object, BaseException, Exception)]
        assert builtin_bases, f"{cls.__name__} does not subclass a specific builtin"


def test_pickle_round_trip_keeps_type_message_context():
    for cls in _subclasses():
        err = cls(f"{cls.__name__} happened because X; do Y", sample=3, counts=[1, 2])
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is cls
        assert str(back) == str(err)
        assert back.context == {"sample": 3, "counts": [1, 2]}


def test_builtin_except_clauses_still_catch():
    from t1ops.errors import ConfigError, ControlPlaneTimeout
    try:
        raise ControlPlaneTimeout("x")
    except TimeoutError:
        pass
    try:
        raise ConfigError("y")
    except ValueError:
        pass
