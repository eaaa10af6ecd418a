"""`t1ops plan simulate`: the event model reproduces the rules it encodes on hand-given inputs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from t1ops.cli import main
from t1ops.config import parse_config
from t1ops.errors import ConfigError
from t1ops.plan.inputs import SimConfig, Workload, stream_seconds_per_token
from t1ops.plan.report import summarise
from t1ops.plan.simulate import simulate


def config(**over) -> SimConfig:
    """Trials of exactly 3 s (one turn of 300 tokens at 100 tokens/s, one stream per engine),
    8 x 300 tokens per batch; train time set per test through s_per_token."""
    data = {"cluster": {"num_engines": 1000, "engine_curve": [[1, 100.0]]},
            "rollout": {"batch_size": 8, "group_size": 1, "max_concurrency": 1000, "sandbox_rate_per_s": 1e6},
            "pipeline": {"mode": "one_step", "steps": 4},
            "train": {"s_per_token": 5.0 / 2400},
            "trials": {"turns": {"value": 1}, "output_tokens_per_turn": {"value": 300}, "prompt_tokens": {"value": 0},
                       "exec_s_per_turn": {"value": 0}, "create_s": {"value": 0}, "verify_s": {"value": 0}},
            "repeats": 1}
    for key, value in over.items():
        section, name = key.split("__")
        data.setdefault(section, {})[name] = value
    return parse_config(data, SimConfig)


def run(cfg: SimConfig) -> dict:
    return summarise(cfg, simulate(cfg, Workload(hand=cfg.trials)))


def test_one_step_rule_step_is_max_of_rollout_and_train():
    slow_train = run(config())  # rollout 3 s, train 5 s
    assert slow_train["step_s_per_step"] == pytest.approx([3 + 5, 5, 5, 5])  # step 1 also waits for batch 1
    fast_train = run(config(train__s_per_token=2.0 / 2400))  # rollout 3 s, train 2 s
    assert fast_train["step_s_per_step"] == pytest.approx([3 + 3, 3, 3, 2])  # the last step has no next batch
    assert fast_train["one_step_rule_s"] == pytest.approx(3.0)


def test_sync_is_the_sum_and_sync_seconds_add():
    out = run(config(pipeline__mode="sync", train__sync_s=0.5))
    assert out["step_s_per_step"] == pytest.approx([3 + 5 + 0.5] * 4)
    assert out["split_s"]["rollout_wait"] == pytest.approx(3) and out["idle_share"]["train_gpus"] == pytest.approx(
        1 - 5 / 8.5)


def test_staleness_capacity_rule_bounds_throughput():
    """Instant training: throughput is the capacity rule's (S + 1) x B groups per trial duration,
    unless fewer group workers run."""
    cfg = dict(pipeline__mode="fully_async", pipeline__steps=6, pipeline__max_staleness=1,
               pipeline__num_parallel_generation_workers=100, rollout__batch_size=4, rollout__group_size=2,
               train__s_per_token=0.0)
    out = run(config(**cfg))
    assert out["trajectories_per_s"] == pytest.approx((1 + 1) * 2 * 2 / 3)
    assert out["step_s_per_step"] == pytest.approx([3, 0, 3, 0, 3, 0])
    assert out["staleness"]["violations"] == 0 and out["staleness"]["max_lag"] == 1
    few = run(config(**{**cfg, "pipeline__num_parallel_generation_workers": 2}))
    assert few["trajectories_per_s"] == pytest.approx(2 * 2 / 3)


def test_long_tail_violates_the_staleness_budget_in_fully_async():
    tail = {"kind": "choice", "values": [1, 40], "weights": [0.8, 0.2]}
    out = run(config(pipeline__mode="fully_async", pipeline__steps=20, pipeline__max_staleness=1,
                     pipeline__num_parallel_generation_workers=8, trials__turns=tail, train__s_per_token=1.0 / 2400))
    assert out["staleness"]["violations"] > 0 and out["staleness"]["max_lag"] > 1


def test_token_bucket_paces_sandbox_creation():
    out = run(config(pipeline__mode="sync", rollout__sandbox_rate_per_s=1.0, rollout__bucket_burst=1))
    assert out["rollout_s"] == pytest.approx(7 + 3)  # the 8th token comes 7 s after the first


def test_skim_cancels_the_tail_at_its_next_turn():
    tail = {"kind": "choice", "values": [1, 10], "weights": [0.7, 0.3]}
    out = run(config(pipeline__mode="sync", rollout__skim_overprovision=2.0, trials__turns=tail))
    assert 0 < out["skim"]["cancelled_trial_share"] <= 0.5
    assert out["rollout_s"] < 10 * 3  # never waits for a whole 10-turn trial


def test_engine_curve_interpolates_and_saturates():
    curve = [[1, 30.0], [8, 120.0], [32, 200.0]]
    assert stream_seconds_per_token(curve, 1) == pytest.approx(1 / 30)
    assert stream_seconds_per_token(curve, 8) == pytest.approx(8 / 120)
    assert stream_seconds_per_token(curve, 64) == pytest.approx(64 / 200)  # past the curve: saturated


def test_hand_trials_without_a_curve_are_refused():
    cfg = config(cluster__engine_curve=[])
    with pytest.raises(ConfigError, match="engine_curve"):
        simulate(cfg, Workload(hand=cfg.trials))


def test_cli_smoke(tmp_path, capsys):
    sim = tmp_path / "sim.toml"
    sim.write_text("""
repeats = 1
[cluster]
engine_curve = [[1, 30.0], [8, 120.0]]
[rollout]
batch_size = 8
group_size = 2
[pipeline]
mode = "fully_async"
steps = 3
[train]
s_per_token = 0.001
[trials]
turns = {kind = "lognormal", mean = 3, p90 = 6}
""")
    plot = tmp_path / "sim.png"
    assert main(["plan", "simulate", "--config", str(sim), "--json", "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prediction"]["mode"] == "fully_async" and out["prediction"]["step_s"] > 0
    assert "staleness" in out["prediction"] and plot.stat().st_size > 0
    assert main(["plan", "simulate", "--config", str(sim), "--set", "rollout.typo=1"]) == 1  # unknown key: an error


def _span(name, t0, t1, span_id, parent=None, **attrs):
    from datetime import datetime, timezone

    iso = lambda t: datetime.fromtimestamp(1_800_000_000 + t, timezone.utc).isoformat()  # noqa: E731
    return {"name": name, "context": {"trace_id": "t", "span_id": span_id}, "parent_id": parent,
            "start_time": iso(t0), "end_time": iso(t1), "attributes": attrs}


def test_fit_reads_trials_costs_and_a_shared_host(tmp_path):
    """Two 10 s trials (create, two generate calls, one command) beside a 10 s training step;
    the next step trains alone in 2 s: training ran 5x slower beside 2.8 jobs -> 0.56 CPUs."""
    from t1ops.config import load_toml
    from t1ops.plan.fit import fit_run

    (tmp_path / "config.json").write_text(load_toml(Path(__file__).resolve().parents[2] / "examples" / "tiny" / "campaign.toml").model_dump_json())
    rows = [{"step": s, "train_s": t, "sync_s": 0.5, "step_s": t + 1.5, "num_trajectories": 2} for s, t in ((1, 10), (2, 2))]
    (tmp_path / "summary.json").write_text(json.dumps({"steps": rows}))
    spans = []
    for k in ("a", "b"):
        spans += [_span("trial", 0, 10, f"{k}0", task=f"task-{k}", group_id=f"g{k}"),
                  _span("sandbox.create", 0, 1, f"{k}1", f"{k}0"),
                  _span("generate", 1, 3, f"{k}2", f"{k}0", prompt_tokens=100, output_tokens=20),
                  _span("sandbox.exec", 3, 4, f"{k}3", f"{k}0"),
                  _span("generate", 4, 6, f"{k}4", f"{k}0", prompt_tokens=130, output_tokens=20),
                  _span("reward", 9, 10, f"{k}5", f"{k}0", reward=1.0)]
    tele = tmp_path / "telemetry"
    tele.mkdir()
    (tele / "spans.jsonl").write_text("".join(json.dumps(s) + "\n" for s in spans))
    t = 1_800_000_000
    events = [("campaign.train_submitted", 1, 0), ("campaign.train_done", 1, 10), ("campaign.sync_done", 1, 10.5),
              ("campaign.train_submitted", 2, 20), ("campaign.train_done", 2, 22), ("campaign.sync_done", 2, 22.5)]
    (tele / "events.jsonl").write_text("".join(json.dumps({"name": n, "step": s, "time": t + x}) + "\n"
                                               for n, s, x in events))
    fields, workload, notes = fit_run(tmp_path)
    assert fields["cluster"]["shared_host_cpus"] == pytest.approx(2.8 / 5)
    assert fields["train"]["s_per_token"] == pytest.approx(2 / (2 * 150))   # the alone step, 150 tokens a trial
    assert fields["train"]["sync_s"] == pytest.approx(0.5) and fields["train"]["overhead_s"] == pytest.approx(1.0)
    assert fields["pipeline"]["zero_variance_share"] == 0.0   # single-sample groups: none to judge
    (a, _) = sorted(workload.samples, key=lambda s: s.task)
    assert a.task == "task-a" and [t.output_tokens for t in a.turns] == [20, 20]
    assert [t.new_prompt_tokens for t in a.turns] == [100, 10] and a.turns[0].exec_s == pytest.approx(1.0)
    k = 3 / (2.8 / 5)   # outside its command, each trial ran beside the other and the trainer: 3 jobs on 0.56 CPUs
    assert a.turns[0].generate_s == pytest.approx(2 / k) and a.post_s == pytest.approx(4 / k)


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "examples" / "simulate").glob("*.toml")))
def test_shipped_simulation_configs_parse(path):
    from t1ops.config import load_toml

    cfg = load_toml(path, SimConfig)
    assert cfg.trials is not None and cfg.cluster.engine_curve


def test_zero_variance_share_counts_training_groups_only():
    from t1ops.plan.fit import zero_variance_share

    spans = []

    def trial(group: str, i: int, reward: float) -> None:
        sid = f"{group}-s{i}"
        spans.append({"name": "trial", "context": {"span_id": sid}, "parent_id": None, "attributes": {"group_id": group}})
        spans.append({"name": "reward", "context": {"span_id": sid + "-r"}, "parent_id": sid,
                      "attributes": {"reward": reward}})

    for i, r in enumerate((0.0, 0.0)):
        trial("st1-g0-sum-0001", i, r)     # all equal
    for i, r in enumerate((0.0, 0.5)):
        trial("st1-g1-sum-0002", i, r)     # signal
    for g in ("eval0-sum-0100", "eval5-sum-0101", "eval10-sum-0102"):
        for i in range(2):
            trial(g, i, 1.0)                # held-out evaluation: all equal, not training groups
    assert zero_variance_share(spans) == 0.5


def test_share_note_warns_when_learning_moved_the_share():
    from t1ops.plan.fit import share_note

    steady = share_note({1: (4, 8), 2: (5, 8), 3: (4, 8)})
    assert "by step: 50, 62, 50%" in steady and "WARNING" not in steady
    collapsed = share_note({1: (4, 8), 2: (7, 8), 3: (8, 8)})   # a policy that collapsed to all-zero
    assert "by step: 50, 88, 100%" in collapsed and "WARNING: the share drifted" in collapsed
    assert "none of more than one trial" in share_note({})
