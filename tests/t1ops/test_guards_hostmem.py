"""Host-RAM guard: cgroup parsing, projection, OOM-kill diagnosis."""
from __future__ import annotations

from pathlib import Path

import pytest

from t1ops import telemetry
from t1ops.config import GuardsConfig
from t1ops.errors import HostOOMKilled, InputError
from t1ops.guards import hostmem

MIB = 2 ** 20


def _v1(d: Path, limit: int, usage: int, peak: int, oom_kill: int) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (d / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (d / "memory.max_usage_in_bytes").write_text(f"{peak}\n")
    (d / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n")
    return d


def _v2(d: Path, limit: str, current: int, oom_kill: int) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.max").write_text(limit + "\n")
    (d / "memory.current").write_text(f"{current}\n")
    (d / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {oom_kill}\noom_group_kill 0\n")
    return d


def test_read_cgroup_v1_and_v2(tmp_path):
    v1 = hostmem.read_cgroup_memory(_v1(tmp_path / "a", 64 * MIB, 60 * MIB, 64 * MIB, 2))
    assert (v1.version, v1.limit_bytes, v1.available_bytes, v1.peak_bytes, v1.oom_kills) == \
        (1, 64 * MIB, 4 * MIB, 64 * MIB, 2)
    unl = hostmem.read_cgroup_memory(_v1(tmp_path / "b", 9223372036854771712, MIB, MIB, 0))
    assert unl.limit_bytes is None and unl.available_bytes is None
    v2 = hostmem.read_cgroup_memory(_v2(tmp_path / "c", "max", 5 * MIB, 7))
    assert (v2.version, v2.limit_bytes, v2.oom_kills) == (2, None, 7)
    assert hostmem.read_cgroup_memory(_v2(tmp_path / "d", str(8 * MIB), 5 * MIB, 0)).available_bytes == 3 * MIB
    with pytest.raises(InputError, match="memory cgroup directory"):
        hostmem.read_cgroup_memory(tmp_path)


def test_own_cgroup_dir_prefers_v1_memory_controller(tmp_path):
    root = tmp_path / "cg"
    _v1(root / "memory" / "job" / "x", MIB, 0, 0, 0)
    _v2(root / "unified" / "slice", "max", 0, 0)
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/job/x\n1:cpu:/\n0::/slice\n")
    assert hostmem.own_cgroup_dir(proc, root) == root / "memory" / "job" / "x"
    proc.write_text("1:cpu:/\n0::/slice\n")
    assert hostmem.own_cgroup_dir(proc, root) == root / "unified" / "slice"
    assert hostmem.own_cgroup_dir(tmp_path / "missing", root) is None


def test_snapshot_takes_the_smaller_of_host_and_cgroup_headroom(tmp_path):
    snap = hostmem.snapshot(_v1(tmp_path / "a", 64 * MIB, 60 * MIB, 64 * MIB, 0))
    assert snap.available_bytes == 4 * MIB
    assert "usage 60.0 MiB of limit 64.0 MiB" in snap.describe()


def test_monitor_warns_when_cgroup_is_nearly_full(tmp_path):
    mon = hostmem.HostMemoryMonitor(warn_fraction=0.9, cgroup_dir=_v1(tmp_path / "a", 64 * MIB, 63 * MIB, 64 * MIB, 0))
    mon.sample()
    assert telemetry.recent_events("host.mem.low")[-1]["used_fraction"] >= 0.9


def test_projection_of_the_reports_plan():
    g = GuardsConfig(adam_host_bytes_per_param=12, sandbox_host_gib=2)
    # two 122B models, fp32 Adam offloaded, optimizer sharded over 16 hosts, 260 sandboxes on one host
    p = hostmem.project_host_memory(122e9, 122e9, num_hosts=16, sandbox_concurrency=260, guards=g)
    assert p.adam_bytes == pytest.approx(2 * 122e9 * 12 / 16)
    assert p.sandbox_bytes == 260 * 2 * hostmem.GIB
    # t1ops' trainer adds its own copies (docs/weights.md, "Host memory of sync and checkpoints"): a world of 1
    # keeps two fp32 versions of the actor for the weight sync and clones the critic to save it
    assert p.weight_sync_bytes == 2 * 122e9 * 4 and p.checkpoint_bytes == 122e9 * 4
    assert p.total_bytes == pytest.approx(p.adam_bytes + p.sandbox_bytes + p.weight_sync_bytes + p.checkpoint_bytes)
    assert hostmem.project_host_memory(1e9, 1e9, offload_optimizer=False).adam_bytes == 0
    with pytest.raises(InputError, match="num_hosts"):
        hostmem.project_host_memory(1e9, 1e9, num_hosts=0)


def test_check_projection_warns_with_the_arithmetic():
    p = hostmem.HostMemoryProjection(adam_bytes=200 * hostmem.GIB, sandbox_bytes=60 * hostmem.GIB, baseline_bytes=0)
    ok = hostmem.check_projection(p, available_bytes=1000 * hostmem.GIB, warn_fraction=0.9)
    assert ok.fits and ok.fraction == pytest.approx(0.26)
    bad = hostmem.check_projection(p, available_bytes=259 * hostmem.GIB, warn_fraction=0.9)
    assert not bad.fits and "offloaded Adam 200.0 GiB" in bad.message and "OOM killer" in bad.message
    assert telemetry.recent_events("host.mem.projection")[-1]["severity"] == "warn"


KLOG = ("[  10.1] python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0\n"
        "[  10.2] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        "oom_memcg=/t1,task_memcg=/t1,task=python,pid=4242,uid=0\n"
        "[  10.3] Memory cgroup out of memory: Killed process 4242 (python) total-vm:300000kB, "
        "anon-rss:64000kB, file-rss:0kB\n"
        "[  11.0] Memory cgroup out of memory: Killed process 42420 (python) total-vm:1kB\n")


def test_kernel_oom_lines_match_the_pid_exactly():
    lines = hostmem.kernel_oom_lines(4242, KLOG)
    assert len(lines) == 2 and all("4242" in ln for ln in lines)
    assert hostmem.kernel_oom_lines(4242, None) is None
    assert hostmem.kernel_oom_lines(7, KLOG) == []


def test_oom_watch_names_an_oom_kill_with_numbers(tmp_path):
    cg = _v1(tmp_path / "a", 64 * MIB, 1 * MIB, 64 * MIB, 0)
    watch = hostmem.OomWatch(cg, kernel_log=lambda: KLOG).arm()
    _v1(cg, 64 * MIB, 1 * MIB, 64 * MIB, 1)  # the kernel bumped the counter
    err = watch.explain_exit(4242, -9, name="trainer")
    assert isinstance(err, HostOOMKilled)
    text = str(err)
    assert "trainer (pid 4242) was killed by the OS OOM killer (exit -9)" in text
    assert "not a crash and not a CUDA OOM" in text and "oom_kill counter 0 -> 1" in text
    assert "limit 64.0 MiB, peak 64.0 MiB" in text and "Killed process 4242" in text
    with pytest.raises(HostOOMKilled):
        watch.check_exit(4242, 137)
    assert telemetry.recent_events("host.oom_killed")[-1]["pid"] == 4242


def test_oom_watch_ignores_normal_exits_and_a_plain_kill_9(tmp_path):
    cg = _v1(tmp_path / "a", 64 * MIB, MIB, MIB, 3)
    watch = hostmem.OomWatch(cg, kernel_log=lambda: "").arm()
    assert watch.explain_exit(1, 0) is None and watch.explain_exit(1, 1) is None
    assert watch.explain_exit(1, -9) is None  # evidence readable, and it says "not OOM"
    watch.check_exit(1, -9)


def test_no_evidence_is_killed_cause_unknown_never_probably_oom(tmp_path):
    # No counter and no kernel log: a SIGKILL is not called an OOM kill.
    watch = hostmem.OomWatch(cgroup_dir=None, kernel_log=lambda: None).arm()
    assert watch.explain_exit(99, -9) is None and watch.explain_exit(99, None) is None
    watch.check_exit(99, -9, name="trainer")
    ev = telemetry.recent_events("process.killed")[-1]
    assert ev["pid"] == 99 and "trainer (pid 99) was killed, cause unknown (exit -9" in ev["message"]
    assert "oom_kill counter unreadable" in ev["message"] and "kernel log unreadable" in ev["message"]
    # Readable evidence that says "no": the verdict says what was read.
    cg = _v1(tmp_path / "b", 64 * MIB, MIB, MIB, 3)
    text = hostmem.OomWatch(cg, kernel_log=lambda: "").arm().unexplained(7, None)
    assert "exit status not readable" in text and "unchanged at 3" in text and "names no OOM kill of pid 7" in text


def test_unreadable_exit_status_still_attributed_by_evidence(tmp_path):
    # A Ray actor's exit status cannot be read; the kernel log naming its pid is enough.
    watch = hostmem.OomWatch(cgroup_dir=None, kernel_log=lambda: KLOG).arm()
    err = watch.explain_exit(4242, None, name="trainer")
    assert isinstance(err, HostOOMKilled) and "exit status not readable" in str(err)
    assert watch.explain_exit(4242, 0) is None  # a clean exit is never an OOM kill


def test_doctor_shows_host_and_cgroup_memory():
    c = hostmem.host_memory_cgroup()
    assert c.name == "host_memory_cgroup" and "host available" in c.detail and "effective available" in c.detail


def test_projection_counts_each_ranks_kept_shards_and_one_bucket_and_no_gather():
    """A multi-rank trainer: nothing gathers the model; a rank keeps two versions of its own shard for the
    weight sync (fp32) and converts one bucket at a time; its checkpoints are by shard (nothing copied)."""
    p = hostmem.project_host_memory(1e9, 1e9, world_size=4, sync_bucket_bytes=512 * 2**20, offload_optimizer=False)
    assert p.weight_sync_bytes == 2 * 1e9 * 4 + 512 * 2**20 and p.checkpoint_bytes == 0
    verdict = hostmem.check_projection(p, 8 * hostmem.GIB)
    assert not verdict.fits and "weight sync 8.0 GiB" in verdict.message
