"""Networks that reach the internet but no address of the host (issue #51; docs/containers.md).

podman's bridge networks NAT a container's traffic out, and deliver what it sends to the
gateway or to any of the host's own addresses to the host itself: every service listening on
0.0.0.0 (Ray's agents, a dashboard, an engine) answers a build step or an ``allow_internet``
trial. Here every network t1ops creates (each networked trial's, and the one its builds use)
takes a /24 of :data:`SUPERNET`, and one host rule drops whatever that supernet sends to an
address of this host (``iptables -I INPUT -s SUPERNET -m addrtype --dst-type LOCAL -j DROP``):
forwarded traffic (the internet) passes, the host's own sockets never see a packet. The
networks have no DNS server of their own (aardvark listens on the gateway, a host address):
containers use the host's resolvers, as the NAT reaches them. Without the rule a network is
not created (fail closed, naming the fix).
"""
from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import threading

from rl.agent.container import runtime
from rl.errors import SandboxError

SUPERNET = ipaddress.ip_network("10.231.0.0/16")
BUILD_NETWORK = "t1ops-build"
HOST_RULE = ("INPUT", "-s", str(SUPERNET), "-m", "addrtype", "--dst-type", "LOCAL", "-j", "DROP")
_LOCK = threading.Lock()


def guard_host() -> None:
    """Install the host rule once (idempotent: ``iptables -C`` first); SandboxError if it cannot."""
    exe = shutil.which("iptables")
    if exe is None:
        raise SandboxError("iptables not found: a t1ops network could reach this host's own services; "
                           "install iptables (scripts/setup-container-runtime.sh)")
    if subprocess.run([exe, "-C", *HOST_RULE], capture_output=True).returncode == 0:
        return
    res = subprocess.run([exe, "-I", *HOST_RULE], capture_output=True, text=True)
    if res.returncode != 0:
        raise SandboxError(f"cannot install the host rule for t1ops networks ({res.stderr.strip()[:200]}); "
                           "run as root with iptables")


def _used_subnets() -> set[ipaddress.IPv4Network]:
    out = set()
    names = runtime.podman("network", "ls", "--format", "{{.Name}}", timeout=60).stdout.split()
    if not names:
        return out
    for net in json.loads(runtime.podman("network", "inspect", *names, timeout=60).stdout or "[]"):
        for sub in net.get("subnets") or []:
            try:
                out.add(ipaddress.ip_network(sub.get("subnet", ""), strict=False))
            except ValueError:
                continue
    return out


def create_network(name: str, labels: list[str], subnet: str | None = None) -> str:
    """A bridge network ``name`` in :data:`SUPERNET` (a free /24 unless ``subnet``), host rule first."""
    guard_host()
    with _LOCK:
        used = _used_subnets()
        free = [subnet] if subnet else [str(s) for s in list(SUPERNET.subnets(new_prefix=24))[1:]
                                        if not any(s.overlaps(u) for u in used)]
        for cand in free[:8]:   # another process may take the same one between look and create
            res = runtime.podman("network", "create", "--disable-dns", "--subnet", cand, *labels, name,
                                 timeout=60, check=False)
            if res.returncode == 0:
                return name
        raise SandboxError(f"cannot create network {name} in {SUPERNET}: no free /24 ({len(used)} in use)")


def build_network() -> str:
    """The network builds run on (created once per host, first /24 of the supernet)."""
    guard_host()
    res = runtime.podman("network", "exists", BUILD_NETWORK, timeout=60, check=False)
    if res.returncode != 0:
        try:
            create_network(BUILD_NETWORK, [], subnet=str(next(SUPERNET.subnets(new_prefix=24))))
        except SandboxError:
            if runtime.podman("network", "exists", BUILD_NETWORK, timeout=60, check=False).returncode != 0:
                raise
    return BUILD_NETWORK
