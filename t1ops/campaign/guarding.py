"""The guardrails a campaign runs with, wired in one place.

- fds: soft nofile raised in the coordinator and (via the Ray set-up hook) in
  every worker; usage sampled each step; a stall detector on rollout results.
- host RAM: projected before launch, sampled each step; a Ray actor that dies
  is checked for an OS OOM kill and reported as such; every role's RSS trend is
  fitted each step and a steady climb warns with its projected time to the limit
  (``t1ops.guards.rss_trend``, host-ram-leak).
- trainer watchdog: the trainer reports progress per step; a slow step is
  classified (warming up / hung) instead of waited on forever; a hung trainer
  gets its Python stacks dumped.
Checkpoint roles, engine health, the bounded control plane, loop-keyed
pacing, ledgers, run-tagged trials, the context budget and task timeouts are
guarded where they happen (trainer host, engine fleet, workers, agent loop).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

from t1ops import telemetry
from t1ops.config import CampaignConfig
from t1ops.errors import HangError
from t1ops.guards.fds import FdGuard, StallDetector
from t1ops.guards.hostmem import HostMemoryMonitor, OomWatch, check_projection, project_host_memory
from t1ops.guards.run_health import RunHealth
from t1ops.guards.rss_trend import RssTrend
from t1ops.guards.watchdog import Watchdog, running_verifiers, signal_stack_dumper

POLL_S = 0.5
TRAINER_RANK = 0


class CampaignGuards:
    def __init__(self, cfg: CampaignConfig, run_dir: Path, dead_engines, pids=None, roles=None) -> None:
        self.cfg = cfg
        self.host_mem = HostMemoryMonitor(cfg.guards.host_ram_warn_fraction)
        # roles: {name: pid} of the coordinator, workers and engines (the trainer is added here)
        self.rss_trend, self._roles = RssTrend(cfg.guards.field), roles
        self.oom = OomWatch().arm()
        # pids: the coordinator plus the campaign's local processes (workers, engines); a process on
        # another node is skipped by the guard (its own node's worker watches it).
        self.fd_guard = FdGuard(cfg.guards.fd_warn_fraction, pids=pids).start(interval_s=cfg.guards.fd_sample_interval_s)
        # a stall names the verifiers that run (slow-verifier): trials live in <run>/trials/<run id>/
        self.stall = StallDetector(cfg.guards.stall_timeout_s, fd_guard=self.fd_guard,
                                   dead_engines=dead_engines, what="trials",
                                   busy=lambda: running_verifiers(run_dir / "trials"))
        self.run_dir = run_dir
        self.watchdog: Watchdog | None = None
        self.trainer_pid: int | None = None
        self.rank_watch = None  # t1ops.guards.rank_watch.RankWatch when the trainer has several ranks
        self.health = RunHealth(cfg.guards.health)  # run-health alarms on every step row (t1ops/guards/run_health.py)
        self._busy_s = 0.0      # seconds the coordinator spent inside guard checks
        self._busy_taken = 0.0  # ... of which already reported

    def attach_trainer(self, pid: int, stack_path: Path) -> None:
        """Watch the trainer process (it installed a faulthandler dump on SIGUSR1)."""
        self.trainer_pid = pid
        self.watchdog = Watchdog.from_config(self.cfg.guards, [TRAINER_RANK],
                                             dump_stacks=signal_stack_dumper({TRAINER_RANK: pid},
                                                                             {TRAINER_RANK: stack_path}),
                                             unit="train step")  # one report per step: no micro-batch beacons

    def attach_ranks(self, rank_watch) -> None:
        """Watch every trainer rank (beacons per micro-batch; all ranks' stacks on a hang)."""
        self.rank_watch = rank_watch

    def wait(self, ref, what: str):
        """``ray.get`` that polls the watchdog (trainer) instead of blocking forever."""
        import ray

        while True:
            ready, _ = ray.wait([ref], timeout=POLL_S)
            if ready:
                try:
                    return ray.get(ready[0])
                except ray.exceptions.ActorDiedError as err:
                    self._explain_death(err, what)
                    raise
            if (self.watchdog is not None or self.rank_watch is not None) and what == "train":
                t0 = time.perf_counter()
                try:
                    self.rank_watch.poll() if self.rank_watch is not None else self.watchdog.check()
                except HangError:
                    telemetry.event("campaign.trainer_hung", severity="error")
                    raise
                finally:
                    self._busy_s += time.perf_counter() - t0

    def train_submitted(self, step: int) -> None:
        """The trainer's silence is timed from here: sync and rollout time are not its silence."""
        if self.rank_watch is not None:
            self.rank_watch.expect_work()
        if self.watchdog is not None:
            # not a report: the rollout and sync before it are no training interval (counted as one,
            # they set the bound before the first, cold train step had run; CI saw a false hang)
            self.watchdog.restart_clock(TRAINER_RANK)

    def wait_train(self, ref, step: int):
        stats = self.wait(ref, "train")
        if self.watchdog is not None:
            self.watchdog.report(TRAINER_RANK, step)
        return stats

    def _explain_death(self, err: Exception, what: str) -> None:
        """A role died: an OS OOM kill is named with its evidence (cgroup counter, kernel log);
        any other death is "killed, cause unknown". Ray's message is not evidence: it blames the
        OOM killer for every worker death, and a Ray actor's exit status is the raylet's, not ours."""
        if self.trainer_pid is None or what != "train":
            return
        self.oom.check_exit(self.trainer_pid, None, name="trainer")

    def project_host_memory(self, actor_params: int, critic_params: int) -> str:
        """Before launch: the host RAM the plan needs vs what is free (warns, never blocks); counts the
        weight sync's kept versions of rank 0's shard and one bucket, and the checkpoint save."""
        proj = project_host_memory(actor_params, critic_params, offload_optimizer=True,  # CPU: Adam is in host RAM
                                   sandbox_concurrency=self.cfg.rollout.max_concurrency, guards=self.cfg.guards,
                                   baseline_bytes=psutil.Process().memory_info().rss,
                                   world_size=self.cfg.trainer.parallel.world_size,
                                   sync_bucket_bytes=self.cfg.engine.weight_sync_bucket_mb * 2**20)
        return check_projection(proj, psutil.virtual_memory().available, self.cfg.guards.host_ram_warn_fraction).message

    def after_step(self, step: int) -> None:
        self.fd_guard.sample()
        t0 = time.perf_counter()
        snap = self.host_mem.sample()
        self.rss_trend.sample(self.role_pids(), snap.available_bytes)
        self._busy_s += time.perf_counter() - t0

    def check_health(self, row: dict, results: list) -> dict:
        """The step row's run-health fields (``health``, ``health_alarms``); the alarms' events fired."""
        t0 = time.perf_counter()
        out = self.health.check(row, results)
        self._busy_s += time.perf_counter() - t0
        return out

    def role_pids(self) -> dict[str, int]:
        """{role: pid} of every campaign process this node can see: coordinator, workers, engines, trainer."""
        roles = dict(self._roles()) if self._roles is not None else {"coordinator": os.getpid()}
        if self.rank_watch is not None:
            roles.update({f"trainer-rank-{r}": p.pid for r, p in self.rank_watch.ranks.items()})
        elif self.trainer_pid is not None:
            roles["trainer"] = self.trainer_pid
        return roles

    def take_busy_s(self) -> float:
        """Seconds spent in the coordinator's guard checks (fd sampling thread included) since the
        last call: the guards' own overhead, reported per step as ``guards_s``."""
        total = self._busy_s + self.fd_guard.busy_s
        delta, self._busy_taken = total - self._busy_taken, total
        return delta

    def stop(self) -> None:
        self.fd_guard.stop()
