"""Loop-keyed token bucket, trial ledger and skim accounting."""
from __future__ import annotations

import asyncio
import threading

import pytest

from t1ops.errors import StallError
from t1ops.guards.pacing import SkimAccounting, TokenBucket, TrialLedger


def _contend(bucket: TokenBucket, n: int) -> int:
    async def go():
        async def one():
            await bucket.acquire()
            return 1
        return sum(await asyncio.gather(*(one() for _ in range(n))))
    return asyncio.run(go())


def test_bucket_shared_by_two_loops_in_two_threads():
    bucket = TokenBucket(rate_per_s=10_000, burst=1)
    assert _contend(bucket, 20) == 20  # the "training loop"
    out = []
    th = threading.Thread(target=lambda: out.append(_contend(bucket, 30)))
    th.start(); th.join(30)
    assert out == [30]


def test_bucket_rate_with_fake_clock():
    now = [0.0]
    b = TokenBucket(rate_per_s=2, burst=2, clock=lambda: now[0])
    assert b._take() == 0 and b._take() == 0
    assert b._take() == pytest.approx(0.5)
    now[0] += 0.5
    assert b._take() == 0


def test_bucket_rejects_bad_rate():
    with pytest.raises(ValueError, match="rate_per_s"):
        TokenBucket(rate_per_s=0)


def test_ledger_names_vanished_trials():
    led = TrialLedger(name="eval")
    for t in ("a", "b", "c", "d"):
        led.expect(t)
    led.complete("a"); led.fail("b", RuntimeError("boom")); led.cancel("c", "skimmed")
    with pytest.raises(StallError, match="1/4 trials vanished") as err:
        led.close()
    assert err.value.context["missing"] == 1
    led.complete("d")
    assert led.close() == {"expected": 4, "completed": 2, "failed": 1, "cancelled": 1, "missing": 0}


def test_ledger_refuses_double_settle_and_unknown():
    led = TrialLedger()
    led.expect("a"); led.complete("a")
    with pytest.raises(ValueError, match="twice"):
        led.complete("a")
    with pytest.raises(ValueError, match="never expected"):
        led.complete("zz")


def test_skim_alarm_only_for_concentrated_tail():
    acct = SkimAccounting()
    for fam in ("a", "b", "c"):
        for _ in range(6):
            acct.record(fam, accepted=True)
    for _ in range(6):
        acct.record("hard", accepted=False)
    assert acct.check() == {"hard": 1.0}
    even = SkimAccounting()
    for fam in ("a", "b"):
        for i in range(8):
            even.record(fam, accepted=i % 4 != 0)
    assert even.check() == {}
