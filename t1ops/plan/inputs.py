"""What `t1ops plan simulate` reads: the typed config and the trial workload (docs/scale.md).

The config (:class:`SimConfig`, TOML, unknown keys are errors) holds what a
launch decides (engines, concurrency, bucket rate, skim, mode and staleness,
batch, group size) and what the run costs (train seconds per token, sync
seconds). The workload is a source of :class:`TrialSample`: resampled from a
measured run (:mod:`t1ops.plan.fit`) or drawn from hand-given distributions
(:class:`TrialsIn`). Generation time follows the per-engine throughput curve
measured by ``bench/bench_engine.py`` (tokens per second at a concurrency).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from t1ops.config import Section
from t1ops.config_errors import FileKind
from t1ops.errors import ConfigError


class Dist(Section):
    """A hand-given distribution: ``fixed`` (value), ``lognormal`` (mean and p90) or ``choice``
    (values with optional weights)."""

    kind: Literal["fixed", "lognormal", "choice"] = Field("fixed", description="Distribution family.")
    value: float = Field(0.0, ge=0, description="The value of a fixed distribution.")
    mean: float = Field(0.0, ge=0, description="Mean of a lognormal.")
    p90: float = Field(0.0, ge=0, description="90th percentile of a lognormal (>= mean: a right tail).")
    values: list[float] = Field(default_factory=list, description="Values of a choice distribution.")
    weights: list[float] = Field(default_factory=list, description="Weights of the values (empty: equal).")

    @model_validator(mode="after")
    def _check(self) -> "Dist":
        if self.kind == "lognormal" and not (self.mean > 0 and self.p90 >= self.mean):
            raise ValueError(f"a lognormal needs mean > 0 and p90 >= mean, got mean {self.mean}, p90 {self.p90}")
        if self.kind == "choice" and (not self.values or (self.weights and len(self.weights) != len(self.values))):
            raise ValueError("a choice needs values (and as many weights, or none)")
        return self

    def sample(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            return self.value
        if self.kind == "choice":
            return rng.choices(self.values, weights=self.weights or None)[0]
        # lognormal with E[X] = mean and q90 = p90: sigma solves z90*s - s^2/2 = ln(p90/mean)
        z90, target = 1.2815515655446004, math.log(self.p90 / self.mean)
        sigma = z90 - math.sqrt(max(0.0, z90 * z90 - 2 * target))
        mu = math.log(self.mean) - sigma * sigma / 2
        return rng.lognormvariate(mu, sigma)


class TrialsIn(Section):
    """Hand-given trial distributions (what a run directory would otherwise measure)."""

    turns: Dist = Field(default_factory=lambda: Dist(value=2), description="Agent turns per trial.")
    output_tokens_per_turn: Dist = Field(default_factory=lambda: Dist(value=48), description="Tokens generated per turn.")
    prompt_tokens: Dist = Field(default_factory=lambda: Dist(value=256), description="First prompt's tokens.")
    observation_tokens_per_turn: Dist = Field(default_factory=lambda: Dist(value=16),
                                              description="Tokens a tool observation appends per turn (prefilled).")
    exec_s_per_turn: Dist = Field(default_factory=lambda: Dist(value=0.1), description="Sandbox seconds per turn.")
    create_s: Dist = Field(default_factory=lambda: Dist(value=0.1), description="Sandbox creation seconds.")
    verify_s: Dist = Field(default_factory=lambda: Dist(value=0.5), description="Verifier seconds.")


class ClusterIn(Section):
    train_gpus: int = Field(1, ge=1, description="GPUs of the trainer (actor and critic time-share them).")
    rollout_gpus: int = Field(1, ge=1, description="GPUs of the engines (disjoint from the trainer's).")
    num_engines: int = Field(1, ge=1, description="Inference engines; a request goes to the least loaded.")
    engine_curve: list[list[float]] = Field(
        default_factory=list, description="Per-engine throughput curve [[concurrency, generated tokens/s], ...] "
        "(bench/bench_engine.py). Empty: a measured turn keeps its measured generate time.")
    prefill_tokens_per_s: float = Field(0.0, ge=0, description="New prompt tokens an engine prefills per second "
                                        "(hand-given trials; 0: prefill is free, e.g. measured inside the curve).")
    shared_host_cpus: float = Field(0.0, ge=0, description="Rollout and trainer share this many CPUs (processor "
                                    "sharing: each running trial and the training trainer is one job; a phase runs "
                                    "max(1, jobs / cpus) times slower). 0: disjoint devices, as on a GPU cluster. "
                                    "Fitted from a CPU run (t1ops.plan.fit).")


class RolloutIn(Section):
    batch_size: int = Field(32, ge=1, description="Trajectories trained per step.")
    group_size: int = Field(1, ge=1, description="Samples per prompt (a group).")
    max_concurrency: int = Field(8, ge=1, description="Trials in flight at once (all rollout workers).")
    sandbox_rate_per_s: float = Field(20.0, gt=0, description="Sandbox creations per second (token bucket).")
    bucket_burst: int | None = Field(None, ge=1, description="Bucket burst (None: max_concurrency, as the worker).")
    skim_overprovision: float = Field(1.0, ge=1, le=4, description="Launch this multiple of the groups; accept "
                                      "the first to finish, cancel the tail at its next turn (one_step, sync).")
    trial_wall_s: float | None = Field(None, gt=0, description="A trial stops at its first turn boundary after this.")


class PipelineIn(Section):
    mode: Literal["sync", "one_step", "fully_async"] = Field("one_step", description="Step pipeline (docs/async.md).")
    steps: int = Field(10, ge=1, description="Steps simulated per repeat.")
    max_staleness: int = Field(1, ge=0, description="fully_async: max_staleness_steps.")
    num_parallel_generation_workers: int = Field(8, ge=1, description="fully_async: groups generating at once.")
    zero_variance_share: float = Field(0.0, ge=0, lt=1, description="fully_async: share of groups dropped "
                                       "(all rewards equal) and redrawn.")


class TrainIn(Section):
    fixed_s: float = Field(0.0, ge=0, description="Train seconds per step independent of tokens.")
    s_per_token: float = Field(0.0, ge=0, description="Train seconds per trained token.")
    sync_s: float = Field(0.0, ge=0, description="Publish + weight-sync seconds per step.")
    overhead_s: float = Field(0.0, ge=0, description="Coordinator seconds per step outside rollout, train, sync.")


class SimConfig(Section):
    """The root of a simulation file (``examples/simulate/*.toml``, ``t1ops plan simulate --config``)."""

    FILE_KIND: ClassVar[FileKind] = FileKind("simulation config", "t1ops plan simulate --schema",
                                             "examples/simulate/t1-report-128gpu.toml",
                                             "t1ops plan simulate --config")
    cluster: ClusterIn = Field(default_factory=ClusterIn, description="GPUs and engines.")
    rollout: RolloutIn = Field(default_factory=RolloutIn, description="Batch, concurrency, pacing, skim.")
    pipeline: PipelineIn = Field(default_factory=PipelineIn, description="Mode and staleness.")
    train: TrainIn = Field(default_factory=TrainIn, description="Trainer and sync costs.")
    trials: TrialsIn | None = Field(None, description="Hand-given trial distributions (None: --from RUN_DIR).")
    seed: int = Field(0, description="Seed of the sampled trials.")
    repeats: int = Field(3, ge=1, description="Independent repeats averaged.")

    @model_validator(mode="after")
    def _check_groups(self) -> "SimConfig":
        if self.rollout.batch_size % self.rollout.group_size:
            raise ValueError(f"rollout.batch_size {self.rollout.batch_size} is not a multiple of "
                             f"rollout.group_size {self.rollout.group_size}")
        return self


@dataclass
class Turn:
    output_tokens: int
    new_prompt_tokens: int
    generate_s: float | None   # measured (None: from the curve and prefill rate)
    exec_s: float


@dataclass
class TrialSample:
    """One trial's work: sandbox creation, turns (generate then execute), then the rest
    (finish, verify, bookkeeping); ``tokens`` is what the trainer trains on."""

    create_s: float
    turns: list[Turn]
    post_s: float
    tokens: int
    task: str = ""


@dataclass
class Workload:
    """Where trials come from, and the per-stream concurrency their generate times were measured at."""

    samples: list[TrialSample] = field(default_factory=list)
    hand: TrialsIn | None = None
    measured_concurrency: float = 1.0   # generate requests per engine at once, when measured

    @property
    def tasks(self) -> list[str]:
        """The measured tasks, sorted (the campaign's training pool when every task was sampled)."""
        return sorted({s.task for s in self.samples if s.task})

    def draw(self, rng: random.Random, task: str | None = None) -> TrialSample:
        """A trial: of ``task`` when given and measured (a group's samples share their prompt)."""
        if self.samples:
            if task:
                return rng.choice([s for s in self.samples if s.task == task])
            return rng.choice(self.samples)
        if self.hand is None:
            raise ConfigError("no trial distribution: pass --from RUN_DIR (measured trials) or give [trials] "
                              "in the simulation config", key="trials")
        h = self.hand
        turns, prompt = max(1, round(h.turns.sample(rng))), round(h.prompt_tokens.sample(rng))
        out = [Turn(round(h.output_tokens_per_turn.sample(rng)),
                    prompt if i == 0 else round(h.observation_tokens_per_turn.sample(rng)), None,
                    h.exec_s_per_turn.sample(rng)) for i in range(turns)]
        tokens = sum(t.output_tokens + t.new_prompt_tokens for t in out)
        return TrialSample(h.create_s.sample(rng), out, h.verify_s.sample(rng), tokens)


def stream_seconds_per_token(curve: list[list[float]], n: float) -> float:
    """Seconds per generated token of one stream when ``n`` streams share an engine:
    ``n / T(n)``, T interpolated linearly in log(n) between the curve's points and flat
    (saturated) past its ends."""
    pts = sorted(curve)
    n = max(1.0, n)
    if n <= pts[0][0]:
        rate = pts[0][1] * n / pts[0][0]  # below the first point: throughput grows with streams
    elif n >= pts[-1][0]:
        rate = pts[-1][1]
    else:
        for (n0, t0), (n1, t1) in zip(pts, pts[1:]):
            if n0 <= n <= n1:
                w = (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
                rate = t0 + w * (t1 - t0)
                break
    return n / rate
