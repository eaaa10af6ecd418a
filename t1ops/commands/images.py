"""`t1ops images seed|list`: base images for the container backend on registry-less hosts."""
from __future__ import annotations

import argparse
import json

NAME = "images"
HELP = "provision base images for task Dockerfiles' FROM names (container backend)"
DESCRIPTION = """\
Air-gapped hosts reach no image registry, so a task Dockerfile's `FROM python:3.12-slim`
cannot be pulled. `seed` builds one Debian root filesystem with mmdebstrap (python3 + pip,
gcc/g++/make, bash, curl, the host's CA certificates from /usr/local/share/ca-certificates)
and tags it with each NAME not already on this host; these stand-ins carry the label
t1ops.standin, and `t1ops tasks check --backend container` names the FROM lines they satisfy.
With a registry, don't seed: FROM pulls as usual. docs/containers.md.

  t1ops images seed                        (the common names: python, ubuntu, debian, gcc)
  t1ops images seed python:3.12-slim golang:1.22-bookworm
  t1ops images list                        (task images and stand-ins on this host)
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    seed = sub.add_parser("seed", help="tag a local Debian rootfs as each FROM name")
    seed.add_argument("names", nargs="*", metavar="NAME", help="image names (default: common bases)")
    seed.add_argument("--force", action="store_true", help="rebuild the rootfs and retag every name")
    seed.add_argument("--mirror", default=None, help="Debian mirror URL (default: mmdebstrap's)")
    seed.add_argument("--json", action="store_true")
    lst = sub.add_parser("list", help="t1ops task images and stand-ins on this host")
    lst.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from rl.agent.container import runtime

    ok, why = runtime.available()
    if not ok:
        print(f"t1ops images: {why}")
        return 1
    if args.action == "seed":
        from rl.agent.container.seed import seed

        done = seed(args.names or None, force=args.force, mirror=args.mirror,
                    log=(lambda *a: None) if args.json else print)
        if args.json:
            print(json.dumps(done, indent=2))
        else:
            for name, how in done.items():
                print(f"{name:<32} {how}")
        return 0
    res = runtime.podman("images", "--format", "json", timeout=60)
    rows = []
    for img in json.loads(res.stdout or "[]") or []:
        labels = img.get("Labels") or {}
        kind = ("stand-in" if "t1ops.standin" in labels else "task" if "t1ops.key" in labels else None)
        if kind:
            rows.append({"names": img.get("Names") or [], "kind": kind, "size_mb": round(img.get("Size", 0) / 2**20)})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['kind']:<9} {r['size_mb']:>6} MB  {', '.join(r['names'])}")
    return 0
