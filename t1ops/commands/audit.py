"""`t1ops audit DUMP`: TITO / R3 accounting over a directory of dumped trajectories."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "audit"
HELP = "per-token TITO/R3 accounting of dumped trajectories (aligned, retokenized, drift)"
DESCRIPTION = """\
Read a directory of trajectory dumps (*.npz, format in t1ops/audit.py) and print
the T1 report's accounting: samples, routing rows, positions aligned /
retokenized / placeholder (%), drift inside the loss region (%, must be 0),
the trajectory-level all-strict share and per-relation counts, and the share of
tokens by how they entered the stream (aligned / normalized / retokenized / split /
placeholder, from the recorded turn relations; t1ops/audit_shares.py), per run and
with --per-trial per trial.

The loss-region drift is measured against the engine's own record: the ids each
engine process (and the OpenAI endpoint) logged per request on its side, in the
run's emissions/ directory beside the dump (or --emissions DIR); drifted positions
are named. Without a record the drift row says so (the dump alone cannot prove 0).

Exit code 1 when any loss-bearing position holds an id the engine never emitted, or
when loss tokens could not be checked against the engine's record.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dump", type=Path, help="directory of <sample_id>.c<chunk>.npz files")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--emissions", type=Path, default=None,
                   help="the engine's record of emitted ids (default: the run's emissions/ beside DUMP)")
    p.add_argument("--per-trial", action="store_true",
                   help="also print one row per trial: token shares by relation and loss-region drift")


SHARE_COLUMNS = ("aligned", "normalized", "retokenized", "split", "placeholder")


def _per_trial_table(per_trial: dict):
    from rich.table import Table

    t = Table(title="per trial: token shares by how each position entered the stream (t1ops/audit_shares.py)")
    t.add_column("trial", no_wrap=True, overflow="fold")
    for name in SHARE_COLUMNS + ("drift in loss",):
        t.add_column(name, justify="right")
    for sid, row in sorted(per_trial.items()):
        t.add_row(sid, *[f"{row[k + '_pct']:.1f}%" for k in SHARE_COLUMNS], f"{row['drift_in_loss']}")
    return t


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from t1ops.audit import audit_dump

    rep = audit_dump(args.dump, args.emissions)
    d = rep.to_dict()
    eng = rep.engine
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        t = Table(title=f"t1ops audit {args.dump}")
        t.add_column("metric")
        t.add_column("value", justify="right")
        rows = [
            ("samples", f"{rep.samples:,}"), ("chunk files", f"{rep.files:,}"),
            ("routing rows", f"{rep.routing_rows:,}"), ("positions", f"{rep.positions:,}"),
            ("aligned", f"{d['aligned_pct']:.2f}%"), ("retokenized", f"{d['retokenized_pct']:.2f}%"),
            ("placeholder", f"{d['placeholder_pct']:.2f}%"),
            ("drift inside loss region (vs engine record)",
             f"{d['engine_drift_in_loss_pct']:.4f}% ({eng['drift']} of {eng['loss_tokens']:,} loss tokens)"
             if eng["record"] else "no engine record (emissions/ missing): cannot be measured"),
            ("loss tokens unverified (no engine record of their request)", f"{eng['unverified']:,}"),
            ("stream vs its own engine_tokens", f"{d['drift_in_loss_pct']:.4f}%"),
            ("all-strict trajectories", f"{100 * d['all_strict_share']:.1f}%"),
        ] + [(f"relation {k}", f"{v:,}") for k, v in rep.relations.items()] + [
            (f"tokens {k}", f"{d['shares'][k + '_pct']:.2f}%") for k in SHARE_COLUMNS]
        for name, value in rows:
            colour = "red" if name.startswith("drift") and (rep.drift_in_loss or eng["drift"]) else ""
            t.add_row(name, f"[{colour}]{value}[/]" if colour else value)
        Console().print(t)
        if args.per_trial:
            Console().print(_per_trial_table(d["per_trial_shares"]))
        for where in eng["positions"]:
            Console().print(f"[red]drift[/] {where}")
        print(f"placeholder {d['placeholder_pct']:.2f}%: positions whose MoE routing row was borrowed from a "
              "neighbour (no engine routing recorded there; docs/architecture.md), not a token error")
    failed, reason = verdict(rep)
    if not args.json:
        print(f"{'FAIL' if failed else 'PASS'}: {reason}")
    return 1 if failed else 0


def verdict(rep) -> tuple[bool, str]:
    """(failed, one-line reason) of an audit: every trained token must be what the engine emitted."""
    eng = rep.engine
    if eng["drift"]:
        return True, f"{eng['drift']} loss token(s) differ from what the engine emitted (see the drift lines)"
    if rep.drift_in_loss:
        return True, f"{rep.drift_in_loss} loss token(s) differ from the stream's own engine_tokens"
    if eng["record"] and eng["unverified"]:
        return True, f"{eng['unverified']} loss token(s) have no engine record of their request to check against"
    if not eng["record"]:
        return False, (f"no drift in {rep.samples} trajectories' loss regions against their own engine_tokens; the "
                       "engine's emissions/ record is missing, so the engine side was not checked")
    return False, f"all {eng['loss_tokens']:,} loss tokens are what the engine emitted (0 drift, 0 unverified)"
