"""PID 1 of one sandboxed command: builds the trial's root, drops to the trial uid, runs the command.

Started by ``rl.agent.sandbox.jail`` as ``unshare --mount --pid [--net] --ipc --uts --fork
--kill-child python -I -S jail_init.py FD``: it is already root inside fresh mount, PID, IPC,
UTS (and network) namespaces. It reads its spec (JSON) from file descriptor FD, then

1. makes every mount private and mounts an empty tmpfs as the new root;
2. binds into it only what the spec names (``/usr``, ``/etc``, the interpreter and venv
   read-only; the trial's own workspace, ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/logs/*``;
   ``/tests`` and ``/solution`` read-only when given), a fresh ``/proc`` of this PID
   namespace and a handful of device nodes; nothing else of the host exists in there
   (the project tree, ``.git``, the task pool, other trials);
3. ``pivot_root`` into it, detaches the old root and remounts the new root read-only;
4. sets ``no_new_privs``, drops every capability from the bounding set, clears the
   supplementary groups and switches real/effective/saved uid and gid to the trial's
   unprivileged ids, then checks ``/proc/self/status`` shows no capability left;
5. applies the per-process rlimits, forks the command and reaps children until the
   command exits; its exit status becomes ours (a signal ``s`` as ``128 + s``). When this
   process exits the kernel kills everything left in the PID namespace.

Any setup failure prints ``t1ops-jail: ...`` and exits 125 before the command starts: the
caller turns that into a SandboxError (fail closed). Standard library only: this file runs
with ``-I -S`` and must not import the project (which is not visible in the new root).
"""
import ctypes
import json
import os
import platform
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}
JAIL_EXIT = 125

_libc = ctypes.CDLL(None, use_errno=True)


def _die(what):
    sys.stderr.write(f"t1ops-jail: {what}\n")
    sys.stderr.flush()
    os._exit(JAIL_EXIT)


def _ok(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        _die(f"{what}: {os.strerror(err)}")


def _mount(src, dst, fstype, flags, data=None):
    enc = (lambda s: None if s is None else os.fsencode(s))
    _ok(_libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f"mount {src} -> {dst}")


def _target(root, dst, is_dir):
    path = root + dst
    if is_dir:
        os.makedirs(path, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if not os.path.exists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    return path


def _bind(root, src, dst, mode):
    """Bind ``src`` at ``dst`` (not recursive: a host submount never leaks in writable)."""
    if not os.path.exists(src):
        _die(f"bind source {src} does not exist")
    path = _target(root, dst, os.path.isdir(src))
    _mount(src, path, None, MS_BIND)
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID
    flags |= 0 if mode == "dev" else MS_NODEV
    flags |= MS_RDONLY if mode in ("ro", "exec-ro") else 0
    _mount(None, path, None, flags)


def build_root(spec):
    root = spec["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("t1ops-root", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    for target, dst in spec.get("symlinks", []):
        os.makedirs(os.path.dirname(root + dst), mode=0o755, exist_ok=True)
        os.symlink(target, root + dst)
    for src, dst, mode in spec["binds"]:
        _bind(root, src, dst, mode)
    for dst, content in spec.get("files", []):
        with open(_target(root, dst, False), "w") as f:
            f.write(content)
        os.chmod(root + dst, 0o444)
    for dst, content in spec.get("etc", []):   # e.g. /etc/passwd naming the trial uid
        src = f"{root}/run/t1ops/etc-{os.path.basename(dst)}"
        os.makedirs(os.path.dirname(src), mode=0o755, exist_ok=True)
        with open(src, "w") as f:
            f.write(content)
        os.chmod(src, 0o444)
        _bind(root, src, dst, "ro")
    _mount("proc", _target(root, "/proc", True), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        if not os.path.lexists(f"{root}/dev/{name}"):
            os.symlink(target, f"{root}/dev/{name}")
    nr = SYS_PIVOT_ROOT.get(platform.machine())
    if nr is None:
        _die(f"pivot_root syscall number unknown for {platform.machine()}")
    os.chdir(root)
    os.mkdir(".old", 0o700)
    _ok(_libc.syscall(ctypes.c_long(nr), b".", b".old"), "pivot_root")
    os.chdir("/")
    _ok(_libc.umount2(b"/.old", MNT_DETACH), "umount the host root")
    os.rmdir("/.old")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def drop_privileges(uid, gid):
    _ok(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:
            _die(f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(ctypes.get_errno())}")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    with open("/proc/self/status") as f:
        status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        if int(status.get(key, "1"), 16) != 0:
            _die(f"{key} = {status.get(key)} after the uid drop; refusing to run")
    if status.get("NoNewPrivs", "0").strip() != "1" or os.getuid() == 0 or os.geteuid() == 0:
        _die("privileges still held after the drop; refusing to run")


def run(spec):
    if spec.get("hostname"):
        name = spec["hostname"].encode()
        _ok(_libc.sethostname(name, len(name)), "sethostname")
    build_root(spec)
    drop_privileges(spec["uid"], spec["gid"])
    for which, soft, hard in spec.get("rlimits", []):
        resource.setrlimit(which, (soft, hard))
    try:
        os.chdir(spec["cwd"])
    except OSError as e:   # the trial's own doing (e.g. chmod 000 /app): the command fails, not the jail
        sys.stderr.write(f"cannot enter {spec['cwd']}: {e.strerror}\n")
        os._exit(126)
    pid = os.fork()
    if pid == 0:
        try:
            os.execve(spec["argv"][0], spec["argv"], spec["env"])
        except OSError as e:
            sys.stderr.write(f"{spec['argv'][0]}: {e}\n")
            os._exit(127)
    while True:   # PID 1 reaps every orphan until the command itself is done
        try:
            done, status = os.wait()
        except ChildProcessError:
            os._exit(JAIL_EXIT)
        if done == pid:
            os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def main():
    fd = int(sys.argv[1])
    with os.fdopen(fd, "rb") as f:
        spec = json.loads(f.read())
    if os.getpid() != 1:
        _die(f"expected to be PID 1 of a new PID namespace, am {os.getpid()}")
    run(spec)


if __name__ == "__main__":
    main()
