"""Why a real task's build, solution or verifier failed, named from its own output.

Public Harbor tasks (docs/containers.md, "Public tasks") fail here for a few recurring
reasons that a bare ``no-verdict`` or an exit status hides: a host the machine cannot reach
(``curl https://astral.sh/uv/...``, ``deb.nodesource.com``), a ``test.sh`` that installs
packages at verification time (the verifier runs unprivileged on a read-only root here, as the
sandbox requires), one that needs root (drops to ``nobody`` to probe the solver), one that
writes outside ``/logs/verifier`` and the workdir, or a pytest command line its pinned pytest
refuses; else the first failed test. Each function returns the first output line that
shows it, or "".
"""
from __future__ import annotations

from rl.agent.bounded import printable

# what a resolver, socket or package manager says when there is no route to a host it needs
UNREACHABLE = ("Could not resolve host", "Temporary failure in name resolution",
               "Temporary failure resolving", "Name or service not known", "Network is unreachable",
               "No route to host", "Failed to establish a new connection",
               "Could not connect to server", "unable to resolve host address", "EAI_AGAIN",
               "getaddrinfo ENOTFOUND", "dns error")
# a package manager refused for lack of root or a writable system tree, at run time
_PKG = ("apt", "dpkg", "pip", "site-packages", "dist-packages", "/.local/bin")
_DENIED = ("Read-only file system", "Permission denied", "are you root")
_READ_ONLY = "Read-only file system"
MAX_LINE = 200


def _lines(*texts: str | None) -> list[str]:
    """The non-blank lines of what a trial printed, control characters escaped (issue #51):
    every line this module returns reaches the operator's terminal."""
    return [printable(s.strip()) for t in texts if t for s in t.splitlines() if s.strip()]


def unreachable(*texts: str | None) -> str:
    """The first line saying a host could not be reached."""
    return next((s[:MAX_LINE] for s in _lines(*texts) if any(p in s for p in UNREACHABLE)), "")


def installs_at_run_time(*texts: str | None) -> str:
    """The first line of a package manager refused for lack of root or a writable root."""
    return next((s[:MAX_LINE] for s in _lines(*texts)
                 if any(d in s for d in _DENIED) and any(p in s for p in _PKG)), "")


def writes_read_only(*texts: str | None) -> str:
    """The first line of a write refused by the read-only root (not a package manager's)."""
    return next((s[:MAX_LINE] for s in _lines(*texts) if _READ_ONLY in s), "")


def verifier_reasons(stdout: str | None, stderr: str | None) -> list[str]:
    """Named reasons why a verifier did not find the task solved (module doc), most specific first."""
    out: list[str] = []
    if line := unreachable(stdout, stderr):
        out.append(f"needs a host it cannot reach ({line})")
    if line := installs_at_run_time(stdout, stderr):
        out.append(f"test.sh installs packages at verification time ({line}): a verifier without the "
                   "network runs unprivileged, offline, on a read-only root; declare allow_internet "
                   "and run with --allow-internet (docs/containers.md), or install them in "
                   "environment/Dockerfile")
    elif line := writes_read_only(stdout, stderr):
        out.append(f"test.sh writes outside /logs/verifier and the workdir ({line})")
    lines = _lines(stdout, stderr)
    if line := next((s[:MAX_LINE] for s in lines if "Operation not permitted" in s), ""):
        out.append(f"test.sh needs root ({line}): the verifier runs as an unprivileged uid here")
    if line := next((s[:MAX_LINE] for s in lines if s.startswith("pytest: error:")), ""):
        out.append(f"test.sh's pytest refused its command line ({line})")
    if not out and (line := next((s[:MAX_LINE] for s in lines if s.startswith("FAILED ")), "")):
        out.append(f"first failed test: {line}")
    return out


def build_reason(log: str) -> str:
    """A failed build's cause when it is a host the build cannot reach, else ""."""
    line = unreachable(log)
    return f"needs a host it cannot reach ({line})" if line else ""


def one_line(text: str, limit: int = 160) -> str:
    """``text`` with its whitespace runs collapsed, cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."
