"""`t1ops plan simulate` against measured runs: predicted vs measured vs error (docs/scale.md).

    python bench/validate_simulate.py RUNS_DIR [--bench-async DIR] [--repeats 5]

RUNS_DIR is what ``bench/scale_runs.py`` wrote (runs.json: one_step, sync, fully_async,
fully_async_nofilter, one_step_2x, one_step_late). The simulator is fitted on one run only (``--fit``, default one_step) and predicts every run from
that run's config (``--campaign RUN/config.json``): mean step time and trajectories per second.
``--bench-async DIR`` is ``bench/bench_async.py --keep DIR``: fitted on its one_step run, it
predicts its fully_async run and the speed-up ratio (fully_async / one_step trajectories/s).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from t1ops.plan.fit import build_config, fit_run, merge, read_spans, sim_config_from_campaign, zero_variance_share
from t1ops.plan.report import summarise
from t1ops.plan.simulate import simulate


def measured(run_dir: Path) -> dict:
    rows = json.loads((run_dir / "summary.json").read_text())["steps"]
    wall = sum(r["step_s"] for r in rows)
    return {"step_s": wall / len(rows), "tps": sum(r["num_trajectories"] for r in rows) / wall}


def predict(fit: tuple, target: Path, repeats: int, share: float | None = None) -> dict:
    """``share``: the zero-variance share to use instead of the fitted one (a given input, not a prediction)."""
    fields, workload, _ = fit
    data = merge(fields, sim_config_from_campaign(json.loads((target / "config.json").read_text())))
    if share is not None:
        data = merge(data, {"pipeline": {"zero_variance_share": share}})
    cfg = build_config(merge(data, {"repeats": repeats}))
    s = summarise(cfg, simulate(cfg, workload))
    return {"step_s": s["step_s"], "tps": s["trajectories_per_s"]}


def row(name: str, p: dict, m: dict) -> str:
    err = lambda k: 100 * (p[k] - m[k]) / m[k]  # noqa: E731
    return (f"{name:26s} {p['step_s']:8.2f} {m['step_s']:8.2f} {err('step_s'):+7.1f}%   "
            f"{p['tps']:7.3f} {m['tps']:7.3f} {err('tps'):+7.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--bench-async", type=Path)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fit", default="one_step", help="the run of RUNS_DIR/runs.json to fit on")
    args = ap.parse_args()
    runs = {k: Path(v["run_dir"]) for k, v in json.loads((args.runs / "runs.json").read_text()).items()}
    fit = fit_run(runs[args.fit])
    print("\n".join(fit[2]))
    print(f"{'run':26s} {'step s':>8s} {'meas.':>8s} {'error':>8s}   {'traj/s':>7s} {'meas.':>7s} {'error':>8s}")
    for name in ("one_step", "sync", "fully_async", "fully_async_nofilter", "one_step_2x", "one_step_late"):
        if name in runs:
            label = name + (" (fitted on)" if name == args.fit else "")
            print(row(label, predict(fit, runs[name], args.repeats), measured(runs[name])))
    if "fully_async" in runs:
        # the filter drops what learning leaves all-equal: the share is the run's outcome, not the pipeline's
        own = zero_variance_share(read_spans(runs["fully_async"]))
        print(f"zero-variance share: fitted {100 * fit[0]['pipeline'].get('zero_variance_share', 0):.0f}%, "
              f"the fully_async run's own {100 * own:.0f}%; given its own share (a check of the timing model, "
              "not a prediction):")
        print(row("fully_async (share given)", predict(fit, runs["fully_async"], args.repeats, own),
                  measured(runs["fully_async"])))
    if args.bench_async:
        dirs = sorted((d for d in args.bench_async.iterdir() if (d / "summary.json").exists()),
                      key=lambda d: json.loads((d / "config.json").read_text())["run"]["mode"] != "one_step")
        one, fa = dirs
        bfit = fit_run(one)
        print("\n".join(bfit[2]))
        p_one, p_fa = predict(bfit, one, args.repeats), predict(bfit, fa, args.repeats)
        m_one, m_fa = measured(one), measured(fa)
        print(row("bench_async one_step (fit)", p_one, m_one))
        print(row("bench_async fully_async", p_fa, m_fa))
        pr, mr = p_fa["tps"] / p_one["tps"], m_fa["tps"] / m_one["tps"]
        print(f"bench_async speed-up fully_async / one_step: predicted {pr:.2f}, measured {mr:.2f}, "
              f"error {100 * (pr - mr) / mr:+.1f}%")


if __name__ == "__main__":
    main()
