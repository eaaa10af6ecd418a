"""Progress watchdog: warm-up vs straggler vs hung, on an injected clock."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from t1ops import telemetry
from t1ops.config import GuardsConfig
from t1ops.errors import HangError, InputError
from t1ops.guards import watchdog as wd

#: The report's warm-up curve, section 09: 489 s -> 22 s per micro-batch.
REPORT_CURVE_S = [489.0, 310.0, 160.0, 85.0, 41.0, 22.0, 22.0, 22.0, 22.0]


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _run_curve(dog: wd.Watchdog, clock: FakeClock, ranks: list[int], curve: list[float], probe_every_s: float):
    """All ranks advance together (peers wait in the all-to-all); classify as time passes."""
    seen = []
    for step, iv in enumerate(curve):
        end = clock.t + iv
        while clock.t + probe_every_s < end:
            clock.t += probe_every_s
            seen.append(dog.check())  # raises HangError on a false hang
        clock.t = end
        for r in ranks:
            dog.report(r, step)
        seen.append(dog.check())
    return seen


def test_report_warmup_curve_is_warming_up_then_ok_and_never_hung():
    clock = FakeClock()
    dog = wd.Watchdog.from_config(GuardsConfig(), ranks=range(4), clock=clock)
    seen = _run_curve(dog, clock, list(range(4)), REPORT_CURVE_S, probe_every_s=7.0)
    statuses = {s.status for states in seen for s in states.values()}
    assert "hung" not in statuses and "warming_up" in statuses
    assert {s.status for s in seen[-1].values()} == {"ok"}
    assert dog.bound_s(0) == pytest.approx(3.0 * 489.0)


def test_first_micro_batch_is_a_warm_up_until_the_first_step_bound():
    clock = FakeClock()
    dog = wd.Watchdog(range(2), first_step_bound_s=3600, clock=clock)
    clock.t = 3600.0
    assert {s.status for s in dog.check().values()} == {"warming_up"}
    clock.t = 3600.5
    with pytest.raises(HangError, match="first-step bound"):
        dog.check()


def test_silent_rank_is_hung_with_its_stacks_dumped_once():
    clock = FakeClock()
    dumps: list[int] = []
    dog = wd.Watchdog(range(3), safety_factor=3.0, min_bound_s=1.0, clock=clock,
                      dump_stacks=lambda r: dumps.append(r) or f"stack-of-{r}")
    for step in range(4):
        clock.t += 20.0
        for r in range(3):
            if not (r == 2 and step >= 2):
                dog.report(r, step)
    # rank 2 last progressed at t=40; bound = 3 x 20 = 60 s
    clock.t = 100.0
    assert dog.classify()[2].status in ("ok", "straggler")
    clock.t = 100.5
    with pytest.raises(HangError) as err:
        dog.check()
    assert "rank 2 hung at micro-batch 1" in str(err.value) and "stack-of-2" in str(err.value)
    assert err.value.context["ranks"] == [2]
    with pytest.raises(HangError):
        dog.check()
    assert dumps == [2]  # one dump per transition into hung
    ev = telemetry.recent_events("watchdog.hung")[-1]
    assert ev["rank"] == 2 and ev["severity"] == "error" and ev["stacks"] == "stack-of-2"
    dog.report(2, 2)  # progress again: no longer hung
    assert dog.classify()[2].status != "hung"


def test_straggler_is_named_but_not_hung():
    clock = FakeClock()
    dog = wd.Watchdog(range(3), min_bound_s=1.0, clock=clock)
    for step in range(1, 7):
        clock.t = step * 10.0
        dog.report(0, step)
        dog.report(1, step)
        if step % 3 == 0:
            dog.report(2, step // 3)
    states = dog.check()
    assert states[2].status == "straggler" and "peers' median" in states[2].reason
    assert states[0].status == "ok"


def test_non_advancing_report_is_not_progress_and_unknown_rank_is_an_error():
    clock = FakeClock()
    dog = wd.Watchdog([0], min_bound_s=1.0, clock=clock)
    clock.t = 5.0
    dog.report(0, 1)
    clock.t = 9.0
    dog.report(0, 1)  # a heartbeat without a new micro-batch
    assert dog.classify()[0].silent_s == pytest.approx(4.0)
    with pytest.raises(InputError, match="unknown rank"):
        dog.report(7, 1)
    with pytest.raises(InputError, match="safety_factor"):
        wd.Watchdog([0], safety_factor=0.5)
    with pytest.raises(InputError, match="ranks"):
        wd.Watchdog([])


def test_is_warming_up():
    assert wd.is_warming_up([489, 300, 150], 2.0)
    assert not wd.is_warming_up([489, 22, 22, 22], 2.0)  # flat now: warmed up
    assert not wd.is_warming_up([10, 9], 2.0)            # no decay to speak of
    assert not wd.is_warming_up([10], 2.0)


def test_signal_stack_dumper_reads_a_blocked_process_stack(tmp_path):
    path = tmp_path / "rank1.stacks"
    code = textwrap.dedent(f"""
        import sys, threading
        from t1ops.guards.watchdog import install_stack_dump
        f = install_stack_dump({str(path)!r})
        def _stuck_in_collective():
            print("ready", flush=True)
            threading.Event().wait()
        _stuck_in_collective()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        dump = wd.signal_stack_dumper({1: proc.pid}, {1: path}, wait_s=10)(1)
        assert dump is not None and "_stuck_in_collective" in dump
    finally:
        proc.kill()
        proc.wait()
    assert wd.signal_stack_dumper({1: proc.pid}, {1: path})(1) is None  # gone: nothing to dump


class WatchdogMachine(RuleBasedStateMachine):
    """Ranks either decay (warm-up) or go silent for good; the clock jumps arbitrarily.

    Properties: a decaying rank is never ``hung``; a silent rank whose silence
    exceeds the bound (computed here independently) always is.
    """

    NUM_RANKS = 3

    @initialize(safety=st.floats(1.0, 4.0), first_bound=st.floats(10.0, 5000.0), min_bound=st.floats(0.1, 100.0),
                firsts=st.lists(st.floats(0.2, 1.0), min_size=NUM_RANKS, max_size=NUM_RANKS),
                decays=st.lists(st.floats(0.3, 1.0), min_size=NUM_RANKS, max_size=NUM_RANKS))
    def setup(self, safety, first_bound, min_bound, firsts, decays):
        self.clock = FakeClock()
        self.safety, self.first_bound, self.min_bound = safety, first_bound, min_bound
        self.dog = wd.Watchdog(range(self.NUM_RANKS), safety_factor=safety, first_step_bound_s=first_bound,
                               min_bound_s=min_bound, clock=self.clock)
        # next interval per rank; the first fits inside the first-step bound
        self.next_iv = [f * first_bound for f in firsts]
        # decay flattens at 1/20 of the first interval, like the report's 489 s -> 22 s
        self.floor = [iv / 20 for iv in self.next_iv]
        self.decay = decays
        self.last_t = [0.0] * self.NUM_RANKS
        self.steps = [0] * self.NUM_RANKS
        self.intervals: list[list[float]] = [[] for _ in range(self.NUM_RANKS)]
        self.silent: set[int] = set()

    def _due(self) -> list[tuple[float, int]]:
        return sorted((self.last_t[r] + self.next_iv[r], r) for r in range(self.NUM_RANKS) if r not in self.silent)

    @rule(frac=st.floats(0.0, 1.5))
    def tick(self, frac):
        end = self.clock.t + frac * max(self._model_bound(r) for r in range(self.NUM_RANKS))
        while (due := self._due()) and due[0][0] <= end:
            t, r = due[0]
            self.clock.t = t
            self.dog.report(r, self.steps[r] + 1)
            self.steps[r] += 1
            self.intervals[r].append(self.next_iv[r])
            self.last_t[r] = t
            self.next_iv[r] = max(self.floor[r], self.next_iv[r] * self.decay[r])
        self.clock.t = max(self.clock.t, end)

    @precondition(lambda self: len(self.silent) < WatchdogMachine.NUM_RANKS)
    @rule(data=st.data())
    def go_silent(self, data):
        r = data.draw(st.sampled_from(sorted(set(range(self.NUM_RANKS)) - self.silent)))
        self.silent.add(r)

    def _model_bound(self, r: int) -> float:
        every = [iv for ivs in self.intervals for iv in ivs]
        if not self.intervals[r] or not every:
            return self.first_bound
        return max(self.min_bound, self.safety * max(every))

    @invariant()
    def properties_hold(self):
        states = self.dog.classify()
        for r, s in states.items():
            if r not in self.silent:
                assert s.status != "hung", (r, s)
            elif self.clock.t - self.last_t[r] > self._model_bound(r):
                assert s.status == "hung", (r, s, self._model_bound(r))


TestWatchdogMachine = WatchdogMachine.TestCase
TestWatchdogMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


def test_a_stall_names_the_running_verifier_first(tmp_path):
    # slow-verifier: the step waits on a reward function; the stall says which one (task, trial, pid)
    import os

    from rl.agent import verifying
    from t1ops.errors import StallError
    from t1ops.guards.fds import StallDetector
    from t1ops.guards.watchdog import running_verifiers

    t = [0.0]
    stall = StallDetector(1.0, clock=lambda: t[0], what="trials", busy=lambda: running_verifiers(tmp_path))
    stall.on_submit(1)
    (tmp_path / "run-1").mkdir()
    with verifying.Entry(tmp_path / "run-1", "slow-reward", "slow-reward-0-ab", "run-1/slow-reward-0-ab", 600.0) as e:
        e.doc["pids"] = [os.getpid()]
        e._write()   # what Entry.resolve records once the verifier's processes exist
        t[0] = 2.0
        with pytest.raises(StallError) as err:
            stall.check()
    msg = str(err.value)
    assert "Likely causes: verifier of task slow-reward, trial slow-reward-0-ab" in msg
    assert f"(pid {os.getpid()}) running" in msg and "not on the trainer or the network" in msg
    t[0] = 4.0
    with pytest.raises(StallError, match=r"none of the checked causes \(verifiers\)"):
        stall.check()   # the verifier finished: its entry is gone


def test_one_rank_trainer_idle_time_is_no_interval_and_its_first_step_gets_the_first_step_bound():
    """CI's false hang: the coordinator reported the 1-rank trainer's idle time (rollout, sync) as an
    interval, so 3 x 24 s of rollout bounded the first, cold train step, which took longer on a loaded
    host. Idle time now restarts the clock; only train steps are intervals."""
    from t1ops.campaign.guarding import TRAINER_RANK, CampaignGuards

    clock = FakeClock()
    guards = CampaignGuards.__new__(CampaignGuards)  # only the watchdog part: no fd threads, no Ray
    guards.rank_watch = None
    guards.watchdog = wd.Watchdog([TRAINER_RANK], min_bound_s=60.0, first_step_bound_s=7200.0, clock=clock)
    clock.t = 24.0  # the first rollout and sync
    guards.train_submitted(1)
    clock.t = 24.0 + 500.0  # the first step: cold Adam state, far beyond 3 x the idle 24 s
    assert guards.watchdog.check()[TRAINER_RANK].status == "warming_up"
    guards.watchdog.report(TRAINER_RANK, 1)  # what wait_train reports when the step returns
    clock.t += 900.0  # the second rollout: idle, not silence
    guards.train_submitted(2)
    clock.t += 3 * 500.0 - 1
    assert guards.watchdog.check()[TRAINER_RANK].status != "hung"
    clock.t += 2
    with pytest.raises(HangError):
        guards.watchdog.check()
