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
import stat
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


O_PATH = getattr(os, "O_PATH", 0o10000000)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _walk(root_fd, parts, create):
    """A held fd of ``root/parts...``: each component opened relative to the one before with
    O_NOFOLLOW (created with mkdirat when ``create``); a link anywhere on the way is refused,
    so root never follows a path that someone else could have planted."""
    fd = os.dup(root_fd)
    for part in parts:
        if part in ("", ".", ".."):
            os.close(fd)
            _die(f"bad path component {part!r}")
        if create:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
        try:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError as e:
            os.close(fd)
            _die(f"open {part!r} without following links: {e.strerror}")
        os.close(fd)
        fd = nxt
    return fd


def _target(root_fd, dst, is_dir):
    """(held fd of the mount target ``dst`` under the new root, its parent fd, its name),
    created without following any link (directories with mkdirat, files O_CREAT|O_EXCL)."""
    parts = [p for p in dst.split("/") if p]
    parent = _walk(root_fd, parts[:-1], True)
    name = parts[-1]
    if is_dir:
        try:
            os.mkdir(name, 0o755, dir_fd=parent)
        except FileExistsError:
            pass
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as e:
            _die(f"open {dst} without following links: {e.strerror}")
        return fd, parent, name
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644, dir_fd=parent)
    except FileExistsError:
        try:
            fd = os.open(name, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except OSError as e:
            _die(f"open {dst} without following links: {e.strerror}")
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            _die(f"mount target {dst} exists and is not a regular file")
    except OSError as e:
        _die(f"create {dst} without following links: {e.strerror}")
    return fd, parent, name


def _bind(root_fd, src, dst, mode):
    """Bind ``src`` at ``dst`` (not recursive: a host submount never leaks in writable). The
    target is reached through held fds (``/proc/self/fd/N``), never by a path that a link
    could redirect; the read-only remount goes through the parent fd and the name."""
    if not os.path.exists(src):
        _die(f"bind source {src} does not exist")
    fd, parent, name = _target(root_fd, dst, os.path.isdir(src))
    _mount(src, f"/proc/self/fd/{fd}", None, MS_BIND)
    os.close(fd)
    try:
        top = os.open(name, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError as e:
        _die(f"reopen {dst} after the bind: {e.strerror}")
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID
    flags |= 0 if mode == "dev" else MS_NODEV
    flags |= MS_RDONLY if mode in ("ro", "exec-ro") else 0
    _mount(None, f"/proc/self/fd/{top}", None, flags)
    os.close(top)
    os.close(parent)


def _write_file(root_fd, dst, content, mode=0o444):
    fd, parent, _ = _target(root_fd, dst, False)
    os.close(fd)
    wfd = os.open(f"/proc/self/fd/{parent}/{os.path.basename(dst)}",
                  os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(wfd, "w") as f:
        f.write(content)
        os.fchmod(f.fileno(), mode)
    os.close(parent)


def build_root(spec):
    root = spec["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("t1ops-root", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    root_fd = os.open(root, _DIR_FLAGS)
    for target, dst in spec.get("symlinks", []):
        parent = _walk(root_fd, [p for p in dst.split("/") if p][:-1], True)
        os.symlink(target, os.path.basename(dst), dir_fd=parent)
        os.close(parent)
    # the root's own files first (in the root-only tmpfs), then the binds: no bind target
    # is ever reached through a directory a trial can write
    for dst, content in spec.get("files", []):
        _write_file(root_fd, dst, content)
    etc = []
    for dst, content in spec.get("etc", []):   # e.g. /etc/passwd naming the trial uid
        src = f"/run/t1ops/etc-{os.path.basename(dst)}"
        _write_file(root_fd, src, content)
        etc.append((f"{root}{src}", dst))
    for src, dst, mode in spec["binds"]:
        _bind(root_fd, src, dst, mode)
    for src, dst in etc:
        _bind(root_fd, src, dst, "ro")
    proc_fd, parent, _ = _target(root_fd, "/proc", True)
    _mount("proc", f"/proc/self/fd/{proc_fd}", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.close(proc_fd)
    os.close(parent)
    os.close(root_fd)
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
