"""The project's one exception hierarchy.

It lives at the bottom layer (``rl``) because ``rl`` must raise these errors
and may not import ``t1ops``; ``t1ops.errors`` re-exports every name.

Each class also subclasses the matching builtin, so ``except ValueError``
keeps working, and every instance survives pickling (errors cross Ray actor
boundaries). Messages say what happened, why, and what to do.
"""
from __future__ import annotations

from typing import Any


class T1OpsError(Exception):
    """Root of every error t1ops raises on purpose.

    ``context`` holds structured facts (sample index, counts, paths) so that
    telemetry and tests can read them without parsing the message.
    """

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def __reduce__(self):  # keeps subclasses picklable whatever their args
        return (_rebuild, (type(self), self.message, self.context))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type, message: str, context: dict) -> "T1OpsError":
    err = cls.__new__(cls)
    T1OpsError.__init__(err, message, **context)
    return err


# --- configuration and input -------------------------------------------------
class ConfigError(T1OpsError, ValueError):
    """A config file or value is invalid (unknown key, out of range)."""


class InputError(T1OpsError, ValueError):
    """An argument has the wrong shape, type or value (names the argument)."""


class DataContractError(T1OpsError, ValueError):
    """A trajectory violates the data contract (lengths, masks, ids)."""


class RoutingError(DataContractError):
    """Routed-expert rows are malformed or misaligned with tokens."""


class MissingRoutingError(RoutingError):
    """An engine returned no routing for a trial: the rollout must abort."""


class TitoError(DataContractError):
    """Token-in/token-out assembly could not keep the sampled ids."""


class RewardError(T1OpsError, ValueError):
    """A reward could not be computed from the inputs given."""


class ParseError(T1OpsError, ValueError):
    """Outside data (CTRF, SGLang response, task.toml, dump) is malformed."""


# --- engines and control plane ----------------------------------------------
class EngineError(T1OpsError, RuntimeError):
    """An inference engine failed a request."""


class EngineDeadError(EngineError):
    """An engine stopped answering health pings past the failure threshold."""


class ControlPlaneTimeout(T1OpsError, TimeoutError):
    """A bounded control-plane call ran out of attempts or deadline."""


# --- trainer and checkpoints -------------------------------------------------
class CheckpointError(T1OpsError, RuntimeError):
    """A checkpoint is missing, corrupt, or would overwrite another role."""


class CheckpointRoleError(CheckpointError):
    """A load or save would mix the actor's and the critic's weights."""


# --- plans and hosts ---------------------------------------------------------
class PreflightRefusal(T1OpsError, ValueError):
    """A cluster plan cannot work; the message carries the arithmetic."""


class HostOOMKilled(T1OpsError, RuntimeError):
    """A process was killed by the OS OOM killer (not a crash, not CUDA OOM)."""


class StallError(T1OpsError, RuntimeError):
    """Work is in flight but nothing has completed for too long."""


class HangError(T1OpsError, RuntimeError):
    """A rank made no progress past its learned bound (not a warm-up)."""


class DistributedTimeoutError(T1OpsError, ValueError):
    """A process group was requested without an explicit timeout."""


class GroupInitError(T1OpsError, TimeoutError):
    """A process-group rendezvous did not complete within its bound on any of its ports."""


class VerifierTimeoutError(T1OpsError, TimeoutError):
    """A trial's verifier outlived its budget: no verdict, so no reward."""


# --- agents, sandboxes and tasks --------------------------------------------
class BudgetError(T1OpsError, ValueError):
    """prompt + max_new_tokens would exceed the context window."""


class TrialDirError(T1OpsError, RuntimeError):
    """A trial directory or verifier output does not belong to this run."""


class SandboxError(T1OpsError, RuntimeError):
    """A sandboxed command hit a resource limit or could not start."""




class UnsafeArchiveError(T1OpsError, ValueError):
    """A task archive holds a member that would escape or exhaust the host."""


class TaskError(T1OpsError, ValueError):
    """A task directory does not follow the Harbor layout."""




class MetricError(T1OpsError, ValueError):
    """A metric reducer disagrees with the direct computation (e.g. a wrong denominator)."""
