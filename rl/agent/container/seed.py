"""``t1ops images seed``: base images for ``FROM`` names on a host that reaches no registry.

One Debian root filesystem is built with ``mmdebstrap --variant=minbase`` from the site's
Debian mirror (stdin ``</dev/null``: with a non-terminal stdin mmdebstrap reads it as a
sources list), with python3 + pip, a C/C++ toolchain, bash, coreutils and the host's extra CA
certificates (``/usr/local/share/ca-certificates``) installed and trusted, so builds reach the
package registries through the site's proxy. It is imported once (``podman import``) and
tagged with every requested ``FROM`` name; each tag carries the ``t1ops.standin`` label, which
``t1ops tasks check`` reports ("python:3.12-slim: stand-in"). A stand-in is not the upstream
image: its Python is Debian's (``python3``, also as ``python``/``pip``), its OS Debian
bookworm whatever the name says. With a registry, don't seed: ``FROM`` pulls as usual.
docs/containers.md.
"""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from rl.agent.container import runtime
from rl.agent.container.images import STANDIN_LABEL, exists
from rl.errors import SandboxError

DEFAULT_NAMES = ("python:3.12-slim", "python:3.11-slim", "python:3.13-slim", "ubuntu:24.04",
                 "ubuntu:22.04", "debian:bookworm-slim", "gcc:13.3.0-bookworm", "gcc:13")
PACKAGES = ("ca-certificates", "bash", "coreutils", "python3", "python3-pip", "python3-venv",
            "gcc", "g++", "make", "libc6-dev", "procps", "curl")
STANDIN = "localhost/t1ops-standin:bookworm"
CA_DIR = Path("/usr/local/share/ca-certificates")


def _hooks() -> list[str]:
    hooks = []
    if CA_DIR.is_dir() and any(CA_DIR.glob("*.crt")):
        hooks += ["--customize-hook=mkdir -p \"$1/usr/local/share/ca-certificates\"",
                  f"--customize-hook=cp {CA_DIR}/*.crt \"$1/usr/local/share/ca-certificates/\"",
                  "--customize-hook=chroot \"$1\" update-ca-certificates"]
    # the names promise python/pip/cc at the usual paths; pip may install system-wide as in
    # the upstream python images (no PEP 668 marker), and trusts the system CA bundle
    hooks += ["--customize-hook=rm -f \"$1\"/usr/lib/python3*/EXTERNALLY-MANAGED",
              "--customize-hook=ln -sf /usr/bin/python3 \"$1/usr/local/bin/python\"",
              "--customize-hook=ln -sf /usr/bin/pip3 \"$1/usr/local/bin/pip\"",
              "--customize-hook=printf '[global]\\ncert = /etc/ssl/certs/ca-certificates.crt\\n' > \"$1/etc/pip.conf\""]
    return hooks


def build_rootfs(out: Path, *, suite: str = "bookworm", mirror: str | None = None,
                 timeout_s: float = 1800) -> None:
    argv = ["mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", *_hooks(),
            suite, str(out), *([mirror] if mirror else [])]
    res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=timeout_s)
    if res.returncode != 0 and _made_anyway(res.stderr, out):
        return
    if res.returncode != 0:
        raise SandboxError(f"mmdebstrap failed (exit {res.returncode}): {res.stderr.strip()[-600:]}; "
                           "is the Debian mirror reachable? (--mirror URL)")


def _made_anyway(stderr: str, out: Path) -> bool:
    """mmdebstrap wrote the tarball but could not remove its temporary root because the
    kernel called its /proc mount busy (seen on these hosts): detach it lazily and go on."""
    if "I: creating tarball" not in stderr or not out.is_file() or out.stat().st_size == 0:
        return False
    for line in stderr.splitlines():
        if line.startswith("umount: ") and "/proc: target is busy" in line:
            proc = line.split()[1].rstrip(":")
            subprocess.run(["umount", "-l", proc], capture_output=True)
            tmp = Path(proc).parent
            if tmp.name.startswith("mmdebstrap."):
                subprocess.run(["rm", "-rf", "--one-file-system", str(tmp)], capture_output=True)
    return True


def seed(names: list[str] | None = None, *, force: bool = False, mirror: str | None = None,
         log=print) -> dict[str, str]:
    """Tag a stand-in for every name (default :data:`DEFAULT_NAMES`) that is not already here;
    returns ``{name: "present" | "stand-in"}``."""
    names = list(names or DEFAULT_NAMES)
    todo = [n for n in names if force or not exists(n)]
    out = {n: "present" for n in names if n not in todo}
    if not todo:
        return out
    if force or not exists(STANDIN):
        with tempfile.TemporaryDirectory(prefix="t1ops-seed-") as tmp:
            tar = Path(tmp) / "rootfs.tar"
            log(f"building a Debian root filesystem with mmdebstrap ({', '.join(PACKAGES)}) ...")
            build_rootfs(tar, mirror=mirror)
            changes = ["CMD [\"/bin/bash\"]", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                       "ENV LANG=C.UTF-8", "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
                       "ENV REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt",
                       f"LABEL {STANDIN_LABEL}=debian-bookworm-minbase"]
            runtime.podman("import", *[a for c in changes for a in ("--change", c)], str(tar),
                           STANDIN, timeout=600)
    for n in todo:
        runtime.podman("tag", STANDIN, n, timeout=60)
        out[n] = "stand-in"
        log(f"{n}: stand-in ({STANDIN})")
    return out
