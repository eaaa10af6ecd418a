"""Run one command in a fresh namespace set as an unprivileged uid (see ``jail_init.py``).

The launcher is util-linux ``unshare`` (``--mount --pid --ipc --uts --fork --kill-child`` and
``--net`` unless the trial may use the network); its child, ``jail_init.py``, is PID 1 of
the new PID namespace. The launcher joins the trial's cgroup before it execs and dies with
its parent thread (``PR_SET_PDEATHSIG``), so a dying campaign takes every trial with it.
Output is read through pipes, capped, and redacted before anything is written: the trial's
``logs/*.out``/``*.err`` never hold a raw secret.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from rl.agent.sandbox.cgroup import TrialCgroup
from rl.agent.sandbox.limits import ExecResult, Limits, classify
from rl.agent.secrets import redact
from rl.errors import SandboxError

INIT = str(Path(__file__).with_name("jail_init.py"))
JAIL_EXIT = 125
SYSTEM_RO = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
PINNED_PYTEST_INI = "/run/t1ops/pytest.ini"
PR_SET_PDEATHSIG = 1

_LIBC = ctypes.CDLL(None, use_errno=True)   # loaded in the parent: no dlopen between fork and exec


@dataclass(frozen=True)
class View:
    """What one command of a trial sees, jail path -> host path (all under the trial dir)."""

    root_mountpoint: Path                  # empty dir the jail mounts its new root on
    rw: tuple[tuple[str, Path], ...]       # e.g. ("/app", <trial>/fs/workspace)
    ro: tuple[tuple[str, Path], ...] = ()  # e.g. ("/tests", <trial>/tests)
    files: tuple[tuple[str, str], ...] = ()
    cwd: str = "/app"


def unshare_path() -> str:
    found = shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if found is None:
        raise SandboxError("util-linux `unshare` not found; install util-linux (apt-get install "
                           "util-linux) to run trials in namespaces")
    return found


def interpreter_dirs() -> list[str]:
    """The interpreter and venv (pytest, pytest-json-ctrf) the verifier needs, read-only.

    A venv reached through a symlink (a worktree's ``.venv`` linking to a checkout's) is bound at
    its real path too: its scripts' shebangs (``pytest``) name the real path, and without it every
    verifier run exits 127 and every trial scores no-verdict."""
    dirs = {sys.prefix, os.path.realpath(sys.prefix), sys.base_prefix,
            os.path.dirname(os.path.realpath(sys.executable))}
    out = []
    for d in sorted(dirs, key=len):
        if not any(d == k or d.startswith(k.rstrip("/") + "/") for k in (*out, *SYSTEM_RO)):
            out.append(d)
    return out


def system_entries() -> tuple[list[list[str]], list[list[str]]]:
    """(symlinks, read-only binds) that make the host's programs and libraries usable."""
    links, binds = [], []
    for p in SYSTEM_RO:
        if os.path.islink(p):
            links.append([os.readlink(p), p])
        elif os.path.isdir(p):
            binds.append([p, p, "ro"])
    binds += [[d, d, "dev"] for d in DEVICES if os.path.exists(d)]
    return links, binds


def _identity_files(uid: int, home: str) -> list[list[str]]:
    """/etc/passwd and /etc/group with the trial uid added, so tools that look the user up
    (git, ssh, whoami) work; host entries kept (no passwords: those are in /etc/shadow)."""
    out = []
    for path, line in (("/etc/passwd", f"trial:x:{uid}:{uid}:trial:{home}:/bin/bash\n"),
                       ("/etc/group", f"trial:x:{uid}:\n")):
        try:
            host = Path(path).read_text()
        except OSError:
            host = ""
        out.append([path, host.rstrip("\n") + "\n" + line if host else line])
    return out


def build_spec(argv: list[str], view: View, *, env: Mapping[str, str], uid: int,
               rlimits: list[tuple[int, int, int]]) -> dict:
    links, binds = system_entries()
    binds += [[str(host), dst, "ro"] for dst, host in view.ro]
    binds += [[str(host), dst, "rw"] for dst, host in view.rw]
    # Last, so that an interpreter or venv living under /tmp (a CI checkout in /tmp) stays
    # visible on top of the trial's private /tmp instead of being hidden by it.
    binds += [[d, d, "ro"] for d in interpreter_dirs()]
    return {"root": str(view.root_mountpoint), "symlinks": links, "binds": binds,
            "files": [list(f) for f in view.files], "uid": uid, "gid": uid, "cwd": view.cwd,
            "argv": argv, "env": dict(env), "rlimits": [list(r) for r in rlimits],
            "hostname": "trial", "etc": _identity_files(uid, env.get("HOME", view.cwd))}


@dataclass
class _Capture:
    cap: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def drain(self, stream) -> None:
        for chunk in iter(lambda: stream.read(65536), b""):
            self.total += len(chunk)
            room = self.cap + 1 - len(self.data)
            if room > 0:
                self.data += chunk[:room]
        stream.close()

    def text(self) -> str:
        return bytes(self.data[:self.cap]).decode("utf-8", errors="replace")


def _preexec(cgroup: TrialCgroup | None):
    def setup() -> None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if cgroup is not None:
            cgroup.join_current()
    return setup


def run_jailed(argv: list[str], view: View, *, env: Mapping[str, str], uid: int, limits: Limits,
               cgroup: TrialCgroup | None, timeout_s: float, log_dir: Path, network: bool,
               secrets: Mapping[str, str] = {}, budget_cut: bool = False) -> ExecResult:
    """Run ``argv`` jailed; never raises for what the command does (limits and timeouts become
    ``reason``), only when the jail itself cannot be built (SandboxError, fail closed)."""
    spec = build_spec(argv, view, env=env, uid=uid,
                      rlimits=limits.rlimits(per_process_memory=cgroup is None))
    launcher = [unshare_path(), "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child",
                *([] if network else ["--net"]), sys.executable, "-I", "-S", INIT]
    r, w = os.pipe()
    os.write(w, json.dumps(spec).encode())   # specs are a few KiB: far below the pipe buffer
    os.close(w)
    before = cgroup.counters() if cgroup is not None else {}
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen([*launcher, str(r)], env={"PATH": "/usr/bin:/bin"}, cwd="/",
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=(r,), start_new_session=True,
                                preexec_fn=_preexec(cgroup))
    except (OSError, subprocess.SubprocessError) as e:
        raise SandboxError(f"could not start the sandbox launcher {launcher[0]}: {e}", argv=argv) from e
    finally:
        os.close(r)
    # on timeout, killing the launcher is enough: --kill-child, PID 1 dies, the namespace with it
    rc, timed_out, out, err = wait_captured(proc, limits.max_output_bytes, timeout_s,
                                            after_exit=cgroup.kill_all if cgroup is not None else None)
    duration_s = time.monotonic() - t0
    stdout, stderr = redact(out.text(), secrets), redact(err.text(), secrets)
    _write_logs(log_dir, stdout, stderr)
    if rc == JAIL_EXIT and "t1ops-jail:" in stderr:
        line = next(ln for ln in stderr.splitlines() if "t1ops-jail:" in ln)
        raise SandboxError(f"the sandbox could not be built ({line.strip()}); nothing ran. "
                           "Run as root on a kernel with mount/PID namespaces, or see docs/sandbox.md",
                           argv=argv)
    after = cgroup.counters() if cgroup is not None else {}
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    reason = classify(rc, stderr, timed_out, budget_cut, delta)
    return ExecResult(stdout, stderr, None if timed_out else rc, reason, duration_s,
                      out.total > limits.max_output_bytes or err.total > limits.max_output_bytes)


def wait_captured(proc: subprocess.Popen, max_output_bytes: int, timeout_s: float, *,
                  on_timeout=None, after_exit=None) -> tuple[int, bool, _Capture, _Capture]:
    """Wait for ``proc`` at most ``timeout_s`` while draining its stdout/stderr (capped at
    ``max_output_bytes`` each); on timeout call ``on_timeout()`` (what killing the process alone
    would not reach), then kill it. ``after_exit()`` runs before the pipes are joined (kill what
    may still hold them). Returns (exit code, timed out, stdout, stderr): both backends' exec."""
    out, err = _Capture(max_output_bytes), _Capture(max_output_bytes)
    readers = [threading.Thread(target=c.drain, args=(s,), daemon=True)
               for c, s in ((out, proc.stdout), (err, proc.stderr))]
    for t in readers:
        t.start()
    timed_out = False
    try:
        rc = proc.wait(timeout=max(timeout_s, 0.01))
    except subprocess.TimeoutExpired:
        timed_out = True
        if on_timeout is not None:
            on_timeout()
        proc.kill()
        rc = proc.wait()
    if after_exit is not None:
        after_exit()
    for t in readers:
        t.join(timeout=10)
    return rc, timed_out, out, err


def _write_logs(log_dir: Path, stdout: str, stderr: str) -> None:
    """The redacted output, root-only (the directory is 0700)."""
    log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = uuid.uuid4().hex[:8]
    (log_dir / f"{stamp}.out").write_text(stdout)
    (log_dir / f"{stamp}.err").write_text(stderr)
