"""`t1ops runs`: list runs with their status, follow a live one."""
from __future__ import annotations

import argparse
from pathlib import Path

NAME = "runs"
HELP = "list runs (running, finished, crashed and resumable, last step) or follow one: t1ops runs tail RUN"
DESCRIPTION = """\
  t1ops runs [DIR]            the runs under DIR (default: runs/): status, last step / run.steps,
                              last reward, last held-out eval; how to resume a crashed one
  t1ops runs tail RUN [-n N]  print RUN's last N step lines, then each new step and evaluation
                              until it stops (RUN: a run directory, or a run id under runs/)

Status: running; finished; crashed (resumable from step S: `t1ops run CONFIG --resume RUN`) or
crashed (not resumable: no verified checkpoint). `t1ops run` records it in RUN/status.json; a
running run whose process is gone counts as crashed.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="*", metavar="DIR | tail RUN",
                   help="a directory of runs (default: runs), or 'tail' and a run")
    p.add_argument("-n", "--lines", type=int, default=10, help="tail: step lines shown before following (default 10)")
    p.add_argument("--no-follow", action="store_true", help="tail: print and stop, do not wait for new steps")
    p.add_argument("--json", action="store_true", help="list: one JSON object per run")


def run(args: argparse.Namespace) -> int:
    import json

    from t1ops.errors import ConfigError
    from t1ops.runs import find_run, list_runs, render, tail

    if args.target[:1] == ["tail"]:
        if len(args.target) != 2:
            raise ConfigError("usage: t1ops runs tail RUN (a run directory or a run id under runs/)", key="RUN")
        state = tail(find_run(args.target[1]), lines=args.lines, follow=not args.no_follow)
        return 0 if state.status in ("running", "finished") else 1
    if len(args.target) > 1:
        raise ConfigError(f"t1ops runs takes one directory, got {len(args.target)}: {' '.join(args.target)} "
                          "(to follow a run: t1ops runs tail RUN)", key="DIR")
    root = Path(args.target[0] if args.target else "runs")
    states = list_runs(root)
    if args.json:
        for s in states:
            print(json.dumps({"run": str(s.path), "status": s.status, "last_step": s.last_step, "steps": s.steps,
                              "reward": s.reward, "eval_reward": s.eval_reward, "detail": s.detail}))
    else:
        print(render(states, root))
    return 0
