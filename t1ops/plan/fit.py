"""Fit a simulation from a run directory (`t1ops plan simulate --from RUN_DIR`; docs/scale.md).

Read from the run:

- ``config.json``: batch, group size, concurrency, bucket rate, skim, mode, staleness, engines;
- ``telemetry/**/spans.jsonl``: every ``trial`` span and its phases (``sandbox.create``,
  ``generate`` with its prompt and output tokens, ``sandbox.exec``, the rest) -> the trials
  the model resamples, and the mean number of generate requests in flight at once (the
  concurrency their generate times were measured at);
- ``summary.json`` step rows and ``events.jsonl`` (``campaign.train_submitted`` ..
  ``campaign.sync_done``): train seconds per trained token (a trajectory's tokens: its last
  prompt plus output), sync seconds, and the coordinator's own seconds per step
  (``step_s`` minus submitted-to-synced, on steps whose batch was already generated);
- optionally, how much slower rollout phases ran while the trainer trained (a shared host's CPUs).
"""
from __future__ import annotations

import json
import statistics
from datetime import datetime
from pathlib import Path

from t1ops.campaign.trials import is_eval_group
from t1ops.errors import ConfigError
from t1ops.plan.inputs import SimConfig, TrialSample, Turn, Workload


def _t(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def read_spans(run_dir: Path) -> list[dict]:
    spans = []
    for path in sorted(Path(run_dir, "telemetry").rglob("spans.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                s = json.loads(line)
                s["t0"], s["t1"] = _t(s["start_time"]), _t(s["end_time"])
                spans.append(s)
    return spans


def trial_samples(spans: list[dict]) -> tuple[list[TrialSample], list[tuple[float, float]], list[tuple[float, float]]]:
    """The run's trials, every generate call's (start, end) (for its concurrency), and each trial's."""
    children: dict = {}
    for s in spans:
        children.setdefault(s.get("parent_id"), []).append(s)

    def below(span_id: str) -> list[dict]:
        return [d for c in children.get(span_id, []) for d in (c, *below(c["context"]["span_id"]))]

    samples, gens, windows = [], [], []
    for trial in (s for s in spans if s["name"] == "trial"):
        parts = below(trial["context"]["span_id"])
        generate = sorted((p for p in parts if p["name"] == "generate"), key=lambda p: p["t0"])
        execs = [p for p in parts if p["name"] == "sandbox.exec"]
        create = sum(p["t1"] - p["t0"] for p in parts if p["name"] == "sandbox.create")
        if not generate:
            continue
        turns, prev_prompt = [], 0
        for i, g in enumerate(generate):
            end = generate[i + 1]["t0"] if i + 1 < len(generate) else float("inf")
            a = g["attributes"]
            prompt, out = int(a.get("prompt_tokens", 0)), int(a.get("output_tokens", 0))
            turns.append(Turn(out, max(0, prompt - prev_prompt), g["t1"] - g["t0"],
                              sum(e["t1"] - e["t0"] for e in execs if g["t0"] <= e["t0"] < end)))
            prev_prompt = prompt + out
            gens.append((g["t0"], g["t1"]))
        active = trial["t1"] - trial["t0"]
        post = max(0.0, active - create - sum(t.generate_s + t.exec_s for t in turns))
        samples.append(TrialSample(create, turns, post, prev_prompt, trial["attributes"].get("task", "")))
        windows.append(_cpu_intervals(trial["t0"], trial["t1"], execs))
    return samples, gens, windows


def _cpu_intervals(t0: float, t1: float, execs: list[dict]) -> list[tuple[float, float]]:
    """A trial's window minus its sandbox commands (which may sleep: not a job on the host)."""
    out, at = [], t0
    for e in sorted(execs, key=lambda e: e["t0"]):
        if e["t0"] > at:
            out.append((at, e["t0"]))
        at = max(at, e["t1"])
    if t1 > at:
        out.append((at, t1))
    return out


def mean_overlap(intervals: list[tuple[float, float]]) -> float:
    """Mean number of intervals open at once, over the time at least one is open."""
    points = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    covered = weighted = 0.0
    n, last = 0, None
    for t, d in points:
        if last is not None and n > 0:
            covered += t - last
            weighted += n * (t - last)
        n, last = n + d, t
    return weighted / covered if covered else 1.0


def zero_variance_by_step(spans: list[dict]) -> dict[int, tuple[int, int]]:
    """Per step: (training groups whose rewards were all equal, training groups of more than one
    trial). Held-out evaluation's groups are not training groups and are left out."""
    by_id = {s["context"]["span_id"]: s for s in spans}
    groups: dict[str, list[float]] = {}
    steps: dict[str, int] = {}
    for s in spans:
        parent = by_id.get(s.get("parent_id"))
        while parent is not None and parent["name"] != "trial":
            parent = by_id.get(parent.get("parent_id"))
        if (s["name"] == "reward" and parent is not None and "group_id" in parent["attributes"]
                and not is_eval_group(parent["attributes"]["group_id"])):
            gid = parent["attributes"]["group_id"]
            groups.setdefault(gid, []).append(float(s["attributes"]["reward"]))
            steps[gid] = int(parent["attributes"].get("step") or 0)
    out: dict[int, tuple[int, int]] = {}
    for gid, rewards in groups.items():
        if len(rewards) > 1:
            equal, n = out.get(steps[gid], (0, 0))
            out[steps[gid]] = (equal + (max(rewards) == min(rewards)), n + 1)
    return dict(sorted(out.items()))


def overall_share(per_step: dict[int, tuple[int, int]]) -> float:
    """The whole run's share of all-equal groups, from :func:`zero_variance_by_step`."""
    n = sum(total for _, total in per_step.values())
    return sum(equal for equal, _ in per_step.values()) / n if n else 0.0


def zero_variance_share(spans: list[dict]) -> float:
    """Share of the run's training groups whose rewards were all equal (what fully_async drops)."""
    return overall_share(zero_variance_by_step(spans))


def share_note(per_step: dict[int, tuple[int, int]]) -> str:
    """The fit's line on the zero-variance share, warning when it drifted over the run: the share is
    an outcome of learning (a policy that collapses leaves every group all-zero), so a fit on one
    mode's run does not give another mode's (docs/scale.md "Validated, not asserted")."""
    shares = [equal / n for equal, n in per_step.values()]
    if not shares:
        return "  groups with all-equal rewards: none of more than one trial"
    line = (f"  groups with all-equal rewards: {100 * overall_share(per_step):.0f}% (by step: "
            + ", ".join(f"{100 * x:.0f}" for x in shares) + "%; fully_async drops them when zero_variance_filter)")
    if len(shares) > 1 and max(shares) - min(shares) >= 0.25:
        line += ("\n  WARNING: the share drifted over the run (learning changed it): a fully_async prediction "
                 "with the filter depends on it; set pipeline.zero_variance_share to the share that run will see")
    return line


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def _jobs(w: tuple[float, float], trials: list[list[tuple[float, float]]]) -> float:
    """Trial-seconds of host work (outside sandbox commands) inside window ``w``."""
    return sum(_overlap(w, i) for t in trials for i in t)


def fit_host(rows: list[dict], ev: dict, windows: list[tuple[float, float]]) -> tuple[float, list[dict], str]:
    """A shared host's effective CPUs, from how much slower the trainer ran while trials ran.

    Processor sharing: with ``L`` jobs (running trials + the trainer) on ``C`` CPUs each runs
    ``L / C`` times slower, so ``C = L_overlapped / (train time overlapped / train time alone)``
    per trajectory. Needs steps that trained alone (the last one_step step, every sync step)
    and steps that trained beside trials; returns (0, all rows, why) when the run has not both."""
    per_traj, alone, beside, load = {}, [], [], []
    for r in rows:
        key = (("campaign.train_submitted", r["step"]), ("campaign.train_done", r["step"]))
        if key[0] not in ev or key[1] not in ev or not r["num_trajectories"]:
            continue
        w = (ev[key[0]], ev[key[1]])
        trials = _jobs(w, windows) / max(1e-9, w[1] - w[0])
        per_traj[r["step"]] = r["train_s"] / r["num_trajectories"]
        (alone if trials < 0.05 else beside).append(r)
        if trials >= 0.05:
            load.append(trials + 1)
    if not alone or not beside:
        return 0.0, rows, "no step trained both alone and beside trials: devices taken as disjoint"
    slow = statistics.fmean(per_traj[r["step"]] for r in beside) / statistics.fmean(per_traj[r["step"]] for r in alone)
    if slow <= 1.0:
        return 0.0, rows, f"training beside trials was not slower (x{slow:.2f}): devices taken as disjoint"
    cpus = statistics.fmean(load) / slow
    return cpus, alone, (f"shared host: training ran x{slow:.2f} slower beside {statistics.fmean(load) - 1:.1f} "
                         f"trials -> {cpus:.2f} effective CPUs (processor sharing)")


def _as_work(samples: list[TrialSample], windows, train_windows, cpus: float) -> list[TrialSample]:
    """Each trial's phase seconds divided by the host load it ran under (seconds alone); its
    sandbox commands keep their seconds (they may sleep or wait)."""
    out = []
    for s, w in zip(samples, windows):
        busy = sum(b - a for a, b in w)
        jobs = sum(_jobs(i, windows) + sum(_overlap(i, t) for t in train_windows) for i in w) / max(1e-9, busy)
        k = max(1.0, jobs / cpus)
        out.append(TrialSample(s.create_s / k, [Turn(t.output_tokens, t.new_prompt_tokens, t.generate_s / k,
                                                     t.exec_s) for t in s.turns], s.post_s / k, s.tokens, s.task))
    return out


def _events(run_dir: Path) -> dict[tuple[str, int], float]:
    out = {}
    for path in Path(run_dir, "telemetry").rglob("events.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                e = json.loads(line)
                if e["name"].startswith("campaign.") and "step" in e:
                    out[(e["name"], int(e["step"]))] = e["time"]
    return out


def sim_config_from_campaign(cfg: dict) -> dict:
    """The launch decisions of a campaign config (config.json / TOML as a dict) as SimConfig fields."""
    r, run, fa, eng = cfg["rollout"], cfg["run"], cfg.get("fully_async", {}), cfg["engine"]
    mode = run.get("mode") or ("one_step" if run.get("one_step_pipeline", True) else "sync")
    pipeline = {"mode": mode, "steps": run["steps"], "max_staleness": fa.get("max_staleness_steps", 1),
                "num_parallel_generation_workers": fa.get("num_parallel_generation_workers", 8)}
    if not (fa.get("zero_variance_filter", True) and fa.get("sample_full_batch", True)):
        pipeline["zero_variance_share"] = 0.0  # nothing is dropped (else: the fitted share)
    return {"cluster": {"num_engines": eng.get("num_engines", 1)},
            "rollout": {"batch_size": r["batch_size"], "group_size": r["n_samples_per_prompt"],
                        "max_concurrency": r["max_concurrency"],  # one rollout worker (one Ray node) here
                        "sandbox_rate_per_s": r["sandbox_rate_per_s"], "skim_overprovision": r["skim_overprovision"]},
            "pipeline": pipeline}


def fit_run(run_dir: str | Path) -> tuple[dict, Workload, list[str]]:
    """(SimConfig fields, the measured workload, notes on what was fitted) from a finished run."""
    run_dir = Path(run_dir)
    for need in ("config.json", "summary.json"):
        if not (run_dir / need).exists():
            raise ConfigError(f"{run_dir} has no {need}: --from needs a finished run directory "
                              "(t1ops run ... writes it)", path=str(run_dir / need))
    cfg = json.loads((run_dir / "config.json").read_text())
    rows = json.loads((run_dir / "summary.json").read_text())["steps"]
    spans = read_spans(run_dir)
    samples, gens, windows = trial_samples(spans)
    if not samples or not rows:
        raise ConfigError(f"{run_dir}: no trial spans or no step rows to fit from", path=str(run_dir))
    fields = sim_config_from_campaign(cfg)
    conc = mean_overlap(gens) / max(1, fields["cluster"]["num_engines"])
    mean_tokens = statistics.fmean(s.tokens for s in samples)
    ev = _events(run_dir)
    cpus, train_rows, host_note = fit_host(rows, ev, windows)
    if cpus > 0:
        train_windows = [(ev[("campaign.train_submitted", r["step"])], ev[("campaign.train_done", r["step"])])
                         for r in rows if ("campaign.train_done", r["step"]) in ev
                         and ("campaign.train_submitted", r["step"]) in ev]
        samples = _as_work(samples, windows, train_windows, cpus)
        fields["cluster"]["shared_host_cpus"] = cpus
    trained = sum(r["num_trajectories"] for r in train_rows)
    s_per_token = sum(r["train_s"] for r in train_rows) / (trained * mean_tokens)
    sync_s = statistics.fmean(r["sync_s"] for r in rows)
    overheads = [r["step_s"] - (ev[("campaign.sync_done", r["step"])] - ev[("campaign.train_submitted", r["step"])])
                 for r in rows[1:] if ("campaign.sync_done", r["step"]) in ev
                 and ("campaign.train_submitted", r["step"]) in ev]
    overhead = statistics.median(overheads) if overheads and fields["pipeline"]["mode"] == "one_step" else 0.0
    per_step = zero_variance_by_step(spans)
    zv = overall_share(per_step)
    fields["pipeline"].setdefault("zero_variance_share", min(zv, 0.95))
    fields["train"] = {"s_per_token": s_per_token, "sync_s": sync_s, "overhead_s": max(0.0, overhead)}
    notes = [f"fitted from {run_dir.name}: {len(samples)} trials, {len(rows)} steps",
             f"  generate requests in flight per engine (mean, while any): {conc:.2f}",
             f"  trial: {statistics.fmean(len(s.turns) for s in samples):.2f} turns, {mean_tokens:.0f} tokens, "
             f"{statistics.fmean(s.create_s + sum(t.generate_s + t.exec_s for t in s.turns) + s.post_s for s in samples):.2f} s of phases (alone, on a shared host)",
             f"  train {s_per_token * 1e3:.3f} ms per trajectory token, sync {sync_s:.2f} s, "
             f"coordinator {fields['train']['overhead_s']:.2f} s per step",
             f"  {host_note}",
             share_note(per_step)]
    return fields, Workload(samples=samples, measured_concurrency=conc), notes


def merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def apply_sets(data: dict, sets: list[str]) -> dict:
    """``[section.]key=value`` overrides (value parsed as JSON, else kept as a string)."""
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected [section.]key=value, e.g. rollout.batch_size=64", key=item)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        section, _, name = key.partition(".")
        data = merge(data, {section: {name: value}} if name else {section: value})
    return data


def build_config(data: dict, source: str = "t1ops plan simulate") -> SimConfig:
    from t1ops.config import parse_config

    return parse_config(data, SimConfig, source=source)
