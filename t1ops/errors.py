"""Re-export of the exception hierarchy (defined in ``rl.errors``, the bottom layer)."""
from rl.errors import *  # noqa: F401,F403
from rl.errors import T1OpsError  # noqa: F401
