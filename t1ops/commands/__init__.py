"""Subcommands of `t1ops`, one module each (see t1ops/cli.py)."""
