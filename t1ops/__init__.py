"""t1ops: operations for agent RL campaigns (guardrails, preflight, runner)."""
import os as _os

__version__ = "0.1.0"

# Ray starts a whole local cluster when any ``ray.get``/``ray.wait``/``.remote()`` runs while it is
# not initialised ("auto-connect"). A guard or chaos thread that outlives the campaign's
# ``ray.shutdown()`` would do exactly that, from its own thread: Ray's GCS and raylet fate-share
# with the thread that started them (PR_SET_PDEATHSIG), so they are SIGKILLed when that thread
# ends, and about 60 s later the process exits with status 1 ("Failed to connect to GCS") in the
# middle of whatever it is doing. t1ops always calls ``ray.init`` itself (t1ops/campaign/launch.py),
# so a late call must raise instead (docs/campaign.md, "Ray's lifetime"). Set the variable yourself
# to override; it is read when ``ray`` is first imported.
_os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
