#!/usr/bin/env bash
# Install and configure the container backend's runtime (rootful podman + runc, mmdebstrap for
# `t1ops images seed`) on a Debian/Ubuntu host. Idempotent; .ci/run calls it before the tests.
# Exit 0 with a message on hosts where it cannot install (not root, no apt): the container
# tests then skip, printing why. docs/containers.md.
# `--missing` prints the Debian packages it would install and exits (.ci/run installs them together
# with its own, then calls this script to configure them).
set -u
say() { echo "setup-container-runtime: $*" >&2; }
need=""
for p in podman runc mmdebstrap; do command -v "$p" >/dev/null || need="$need $p"; done
if [ "${1:-}" = --missing ]; then echo "$need"; exit 0; fi
if [ "$(id -u)" != 0 ]; then say "not root: skipped (run as root to enable the container backend)"; exit 0; fi
if ! command -v apt-get >/dev/null; then say "no apt-get: install podman + runc by hand"; exit 0; fi
if [ -n "$need" ]; then
  say "installing$need"
  for i in 1 2 3 4 5 6 7 8 9 10 11 12; do   # another apt may hold the lock for a while
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc mmdebstrap >/tmp/t1ops-apt.log 2>&1 && break
    if ! grep -q "Could not get lock" /tmp/t1ops-apt.log; then
      (apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc mmdebstrap >/tmp/t1ops-apt.log 2>&1) && break
      say "apt-get failed: $(tail -2 /tmp/t1ops-apt.log)"; exit 0
    fi
    sleep 10
  done
fi
# crun refuses the cgroup hybrid layout of these hosts; root lacks CAP_SYS_RESOURCE, so default
# ulimits must not exceed the hard limits.
hard_nofile=$(ulimit -Hn); [ "$hard_nofile" = unlimited ] && hard_nofile=1048576
mkdir -p /etc/containers
conf=/etc/containers/containers.conf
if ! grep -q "t1ops" "$conf" 2>/dev/null; then
  cat > "$conf" <<CONF
# written by t1ops scripts/setup-container-runtime.sh
[containers]
default_ulimits = ["nofile=${hard_nofile}:${hard_nofile}", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
  say "wrote $conf"
fi
if podman info >/dev/null 2>&1; then
  say "podman $(podman version --format '{{.Client.Version}}') ready (runtime runc)"
else
  say "podman installed but \`podman info\` fails: $(podman info 2>&1 | tail -1)"
fi
exit 0
