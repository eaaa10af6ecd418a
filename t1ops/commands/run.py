"""`t1ops run`: run a campaign with guardrails on."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "run"
HELP = "run an RL campaign (engines, rollout workers, trainer) on Ray with guardrails on"
DESCRIPTION = """\
Run a campaign described by a TOML file (see `t1ops config` for every key).
The shipped tiny campaign trains a 2-layer megatron-core MoE model on CPU
against the bundled terminal tasks in a few minutes:

  t1ops run examples/tiny/campaign.toml

The run directory holds summary.json (per-step reward, explained variance,
log-prob gap, timings), report.png, telemetry/*.jsonl, trajectory dumps
(`t1ops audit RUN/dumps`), and actor/critic checkpoints. With [eval] it also
evaluates held-out tasks during training (summary.json "eval", the step line).

Any key can be overridden for one run, validated like the file:

  t1ops run examples/tiny/campaign.toml --set trainer.actor_lr=1e-6 --set run.mode=fully_async

After a crash, continue the same run directory from its newest verified step:

  t1ops run examples/tiny/campaign.toml --resume runs/tiny-20260101-120000-abcd

Check before launch: print the effective config (each value's source: default, file, --set) and
run every pre-start check (paths, isolation, task pool and eval split, layout, plan, resume,
memory, open files) without starting Ray or creating a run directory:

  t1ops run examples/tiny/campaign.toml --set trainer.actor_lr=1e-4 --dry-run

Relative paths in the file resolve against its directory; run.out_dir (the runs' parent) against
the working directory. List and follow runs with `t1ops runs`.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, help="campaign TOML file")
    p.add_argument("--out", type=Path, help="parent directory for the run directory (default: run.out_dir)")
    p.add_argument("--steps", type=int, help="override run.steps")
    p.add_argument("--ray-address", help="join an existing Ray cluster (default: start a local one)")
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of a live display")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override one config key, e.g. --set trainer.actor_lr=1e-6 --set run.mode=fully_async "
                        "(repeatable; a TOML value or bare text; validated like the file)")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR",
                   help="continue RUN_DIR from the newest step at which actor, critic and trainer state all "
                        "exist and verify, appending to it (docs/campaign.md)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the effective config with each value's source and run every pre-start check; "
                        "start nothing, write nothing (exit 1 if `t1ops run` would refuse)")


def run(args: argparse.Namespace) -> int:
    from t1ops.config import load_config
    from t1ops.errors import ConfigError
    from t1ops.overrides import parse_assignments

    pairs = parse_assignments(args.overrides)
    pairs += [(k, v) for k, v in (("run.steps", args.steps), ("run.ray_address", args.ray_address)) if v is not None]
    loaded = load_config(args.config, overrides=pairs)
    if args.dry_run:
        from t1ops.dry_run import effective_toml, prestart_checks, render

        print(f"# effective config of {args.config} (source of each value after '#')\n")
        print(effective_toml(loaded))
        text, ok = render(prestart_checks(loaded, out_dir=str(args.out) if args.out else None, resume=args.resume))
        print("pre-start checks (no Ray, no run directory):\n" + text)
        return 0 if ok else 1
    missing = loaded.missing_files()
    if missing:  # before Ray and the run directory (15 s saved, and the resolved path named)
        raise ConfigError(f"{args.config}: " + "; ".join(missing), path=str(args.config))
    from t1ops.campaign.launch import run_campaign

    cfg = loaded.config
    run_dir = run_campaign(cfg, out_dir=str(args.out) if args.out else None,
                           show_progress=not args.no_progress and sys.stderr.isatty(), resume=args.resume)
    print(f"run complete: {run_dir}\n  summary: {run_dir / 'summary.json'}\n  report:  {run_dir / 'report.png'}\n"
          f"  audit:   t1ops audit {run_dir / 'dumps'}")
    return 0
