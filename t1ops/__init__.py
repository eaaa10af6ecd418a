"""t1ops: operations for agent RL campaigns (guardrails, preflight, runner)."""
__version__ = "0.1.0"
