"""host-oom-kill: the kernel kills the trainer for host RAM; logs show no CUDA error.

Fault (real): a child "trainer" allocates the CPU-offloaded fp32 Adam state of
an actor and a critic (12 bytes/param each) inside a memory cgroup this
scenario creates for itself under the v1 memory controller
(``/sys/fs/cgroup/memory/t1ops-chaos-oom-*``, ``memory.limit_in_bytes`` 64 MiB,
scaled from the report's 2265 GB host). The kernel's OOM killer SIGKILLs it:
exit -9, ``memory.oom_control`` ``oom_kill`` grows, dmesg says "Memory cgroup
out of memory: Killed process <pid>". The cgroup is removed afterwards; no
other cgroup is touched. Without cgroups, a user-space killer SIGKILLs the
child at the same cap (reported in ``details.mechanism``).

Unguarded: the supervisor sees "died unexpectedly (exit -9)", a generic crash.
Guarded (``t1ops.guards.hostmem``): the plan's projection warns before launch;
``OomWatch.check_exit`` raises ``HostOOMKilled`` "killed by the OS OOM killer"
with the cgroup limit, peak, counter and kernel line.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

from chaos.harness import Guarded, Outcome, Timeline, register
from t1ops.config import GuardsConfig
from t1ops.errors import HostOOMKilled
from t1ops.guards.hostmem import OomWatch, check_projection, fmt_bytes, project_host_memory

CGROUP_V1 = Path("/sys/fs/cgroup/memory")
LIMIT_BYTES = 64 * 2 ** 20      # the scaled "host"
PARAMS_PER_MODEL = 4_000_000    # x 12 bytes x 2 models = 91.6 MiB of Adam state > 64 MiB
CHUNK_BYTES = 4 * 2 ** 20
NUM_SANDBOXES, SANDBOX_BYTES = 4, 4 * 2 ** 20  # projected beside the trainer (report: 260 workers)
TRAINER = ("import sys\nstate = []\nfor _ in range(int(sys.argv[1]) // int(sys.argv[2]) + 1):\n"
           "    state.append(b'\\x01' * int(sys.argv[2]))  # written, so really resident\n"
           "print('optimizer state allocated', flush=True)\n")


class _Cgroup:
    """A memory cgroup this scenario creates, limits, and removes (v1 controller)."""

    def __init__(self, limit_bytes: int) -> None:
        self.path = CGROUP_V1 / f"t1ops-chaos-oom-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        memsw = self.path / "memory.memsw.limit_in_bytes"
        if memsw.exists():  # no escape into swap
            memsw.write_text(str(limit_bytes))

    def join(self) -> None:  # runs in the child between fork and exec
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> None:
        for pid in (self.path / "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.05)  # the killed tasks leave asynchronously


def _run_trainer(alloc_bytes: int, cgroup: _Cgroup | None) -> tuple[int, int, float]:
    """Start the trainer (inside ``cgroup`` if given); return (pid, exit code, time of death)."""
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(alloc_bytes), str(CHUNK_BYTES)],
                            stdout=subprocess.DEVNULL, preexec_fn=cgroup.join if cgroup else None)
    if cgroup is None:  # fallback: a user-space OOM killer at the same cap
        ps = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                if ps.memory_info().rss > LIMIT_BYTES:
                    proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                break
            time.sleep(0.01)
    rc = proc.wait(timeout=60)
    return proc.pid, rc, time.monotonic()


@register("host-oom-kill", "the OS OOM killer takes the trainer (offloaded Adam + sandboxes); no CUDA error")
def run(tmp: Path) -> Outcome:
    guards = GuardsConfig(sandbox_host_gib=SANDBOX_BYTES / 2 ** 30)
    plan = project_host_memory(PARAMS_PER_MODEL, PARAMS_PER_MODEL, sandbox_concurrency=NUM_SANDBOXES, guards=guards)
    try:
        cgroup: _Cgroup | None = _Cgroup(LIMIT_BYTES)
        mechanism = f"kernel memcg OOM kill in own cgroup {cgroup.path} (limit {fmt_bytes(LIMIT_BYTES)})"
    except OSError as err:
        cgroup = None
        mechanism = f"fallback: cgroup v1 memory controller unavailable ({err}); user-space SIGKILL at RSS cap"
    try:
        pid_u, rc_u, _ = _run_trainer(int(plan.adam_bytes), cgroup)
        unguarded = f"trainer (pid {pid_u}) died unexpectedly: exit code {rc_u}; no CUDA error in the logs"
        # guarded: projection before launch, OomWatch armed, diagnosis after death
        verdict = check_projection(plan, LIMIT_BYTES, guards.host_ram_warn_fraction)
        watch = OomWatch(cgroup.path if cgroup else None,
                         **({} if cgroup else {"kernel_log": lambda: None})).arm()
        pid_g, rc_g, died_at = _run_trainer(int(plan.adam_bytes), cgroup)
        try:
            watch.check_exit(pid_g, rc_g, name="trainer")
            error, caught = "", False
        except HostOOMKilled as err:
            error, caught = str(err), True
        detection_s = time.monotonic() - died_at
        tl = Timeline()  # from the trainer's death (its exit seen); the run stops with the named error
        tl.fault(at=died_at)
        if caught:
            tl.after_fault(detected=detection_s, stopped=detection_s)
    finally:
        if cgroup is not None:
            cgroup.remove()
    removed = cgroup is None or not cgroup.path.exists()
    return Outcome(
        fault_fired=rc_u in (-9, 137) and rc_g in (-9, 137),
        unguarded=unguarded,
        guarded=Guarded(caught=caught, detection_s=detection_s, error=error),
        invariants={
            "unguarded trainer died by SIGKILL with nothing named": rc_u in (-9, 137),
            "projection warned before launch": not verdict.fits,
            "named as OS OOM kill, not a crash": "killed by the OS OOM killer" in error
            or (cgroup is None and "OOM killer" in error),
            "error carries the memory figures": fmt_bytes(LIMIT_BYTES) in error or cgroup is None,
            "own cgroup removed": removed,
        },
        details={"mechanism": mechanism, "projection": verdict.message, "exit_codes": [rc_u, rc_g],
                 "scaled_from": "2265 GB host, two 122B models' fp32 Adam + 260 sandboxes (report, section 09)"},
        recovery=tl.recovery(how="stopped with HostOOMKilled (the projection warned before launch); restart "
                                 "with fewer sandboxes or offload per the runbook: not measured here"),
    )
