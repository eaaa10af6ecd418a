"""`t1ops compare`: start/end held-out reward per group and config, the noise of the difference
from per-trial rewards, the verdict, the figure, and the refusals."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from t1ops.cli import main
from t1ops.commands import compare as cmd
from t1ops.compare import HELD_OUT_FAMILIES, INSTANCES, compare, family_of, group_runs, learning_of
from t1ops.errors import InputError


def write_run(root: Path, name: str, *, seed: int, lr: float = 7e-4, start: dict, end: dict,
              train=("sum-0000", "sum-0001", "grep-0000")) -> Path:
    d = root / name
    d.mkdir()
    evals = [{"step": step, "eval_reward_mean": 0.0, "eval_reward_sem": 0.0, "eval_num_trials": 0, "eval_solved_share": 0.0,
              "eval_trial_rewards": rewards} for step, rewards in ((0, start), (10, end))]
    config = {"run": {"seed": seed, "name": name, "out_dir": "runs", "steps": 10}, "trainer": {"actor_lr": lr}}
    (d / "summary.json").write_text(json.dumps({"config": config, "train_tasks": list(train), "eval": evals}))
    return d


def test_family_of_strips_the_generators_instance_number_only():
    assert (family_of("sum-0016"), family_of("math-sum"), family_of("text-grep-2")) == ("sum", "math-sum", "text-grep")


def test_groups_are_trained_family_instances_and_held_out_families_with_the_noise_of_the_difference(tmp_path):
    start = {"sum-0016": [0.0, 0.5], "grep-0016": [0.25, 0.25], "max-0000": [0.5, 0.5]}
    end = {"sum-0016": [1.0, 1.0], "grep-0016": [0.75, 1.0], "max-0000": [0.5, 0.25]}
    rows = {r.group: r for r in learning_of(write_run(tmp_path, "a", seed=0, start=start, end=end))}
    inst, fam = rows[INSTANCES], rows[HELD_OUT_FAMILIES]
    assert fam.families == ("max",) and inst.families == ("grep", "sum")
    s0 = [0.25, 0.25, 0.0, 0.5]  # grep then sum, as the tasks sort
    s1 = [0.75, 1.0, 1.0, 1.0]

    def se(xs):
        m = sum(xs) / len(xs)
        return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))

    assert inst.points[0].n == 4 and inst.points[0].mean == pytest.approx(0.25)
    assert inst.gain == pytest.approx(sum(s1) / 4 - 0.25)
    assert inst.noise == pytest.approx(2 * math.sqrt(se(s0) ** 2 + se(s1) ** 2))
    assert inst.holds and inst.verdict == "rise beyond noise"
    assert fam.gain == pytest.approx(-0.125) and fam.verdict == "within noise"


def test_seeds_share_a_config_and_a_changed_key_is_named(tmp_path):
    flat = {"sum-0016": [0.5, 0.5, 0.25, 0.75]}
    runs = [write_run(tmp_path, "s0", seed=0, start=flat, end=flat),
            write_run(tmp_path, "s1", seed=1, start=flat, end=flat),
            write_run(tmp_path, "lr", seed=0, lr=1e-3, start=flat, end=flat)]
    groups = group_runs(runs)
    assert [len(g) for _, g in groups] == [2, 1]
    assert groups[0][0] == "config A" and groups[1][0] == "config B (trainer.actor_lr=0.001)"
    lines, configs = compare(runs, tmp_path / "compare.png")
    assert (tmp_path / "compare.png").stat().st_size > 1000
    text = "\n".join(lines)
    assert "instances: rise beyond noise on 0/2 runs, mean gain +0.000" in text
    assert "within noise" in text and "noise = 2 x standard error" in text


def test_the_command_prints_and_check_fails_unless_every_run_rises(tmp_path, capsys):
    up = write_run(tmp_path, "up", seed=0, start={"sum-0016": [0.0, 0.0, 0.25, 0.0]},
                   end={"sum-0016": [1.0, 1.0, 0.75, 1.0]})
    flat = write_run(tmp_path, "flat", seed=1, start={"sum-0016": [0.5, 0.0]}, end={"sum-0016": [0.5, 0.0]})
    args = argparse.Namespace(run_dirs=[up], out=tmp_path / "c.png", no_plot=False, check=True)
    assert cmd.run(args) == 0
    assert "rise beyond noise on 1/1 runs" in capsys.readouterr().out
    assert cmd.run(argparse.Namespace(**{**vars(args), "run_dirs": [up, flat]})) == 1
    assert cmd.run(argparse.Namespace(**{**vars(args), "run_dirs": [up, flat], "check": False})) == 0
    assert main(["compare", str(up), str(flat), "--no-plot"]) == 0  # the console entry point
    assert "config A: 2 run(s)" in capsys.readouterr().out


def test_an_older_run_without_per_trial_rewards_uses_its_eval_mean_and_se(tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    evals = [{"step": 0, "eval_reward_mean": 0.2, "eval_reward_sem": 0.05, "eval_num_trials": 40},
             {"step": 10, "eval_reward_mean": 0.5, "eval_reward_sem": 0.05, "eval_num_trials": 40}]
    (d / "summary.json").write_text(json.dumps({"config": {"run": {"seed": 3}}, "eval": evals}))
    (row,) = learning_of(d)
    assert (row.group, row.seed) == ("all held-out tasks", 3)
    assert row.gain == pytest.approx(0.3) and row.noise == pytest.approx(2 * math.sqrt(2) * 0.05)


def test_refusals_name_the_fix(tmp_path):
    with pytest.raises(InputError, match="no summary.json"):
        learning_of(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"eval": [{"step": 0}]}))
    with pytest.raises(InputError, match=r"1 held-out evaluation\(s\).*eval.every_steps"):
        learning_of(tmp_path)


def test_report_png_draws_the_eval_groups_of_a_run_with_per_trial_rewards(tmp_path, monkeypatch):
    from t1ops.campaign import summary as summary_mod

    d = write_run(tmp_path, "r", seed=0, start={"sum-0016": [0.0, 0.5], "max-0000": [0.25, 0.0]},
                  end={"sum-0016": [1.0, 0.75], "max-0000": [0.0, 0.0]})
    data = json.loads((d / "summary.json").read_text())
    data["steps"] = [{"step": s, "reward_mean": 0.3, "explained_variance": 0.1, "logprob_gap": 0.01,
                      "step_s": 1.0, "solved_share": 0.2} for s in (1, 10)]
    (d / "summary.json").write_text(json.dumps(data))
    drawn = []
    real = summary_mod._plot_eval_groups
    monkeypatch.setattr(summary_mod, "_plot_eval_groups", lambda ax, p: drawn.append(ax.get_legend_handles_labels())
                        or real(ax, p) or drawn.append(ax.get_legend_handles_labels()))
    assert summary_mod.plot(d / "summary.json").stat().st_size > 1000
    labels = drawn[-1][1]
    assert "eval: instances" in labels and "eval: held-out families" in labels
