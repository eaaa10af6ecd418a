"""Start a stdio MCP server inside a trial's sandbox, for the builtin agent's toolbox.

The server runs exactly like an agent command (``rl.agent.sandbox.jail``): fresh
namespaces, the trial's private root and uid, its cgroup, no network unless the
trial has it; the harness program directory is bound read-only at
``JAIL_HARNESS_DIR`` so servers shipped next to a harness can run. The ``mcp``
SDK's ``stdio_client`` spawns a tiny ``/bin/sh`` that opens the jail spec as fd 3,
removes the spec file, joins the trial's cgroup and execs the jail launcher,
whose stdin/stdout become the server's: the SDK then speaks MCP over them.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import uuid
from dataclasses import replace
from pathlib import Path

from rl.harness.command_agent import JAIL_HARNESS_DIR


def jailed_server(trial, argv: list[str], env: dict[str, str], *, harness_dir: Path):
    """``StdioServerParameters`` that run ``argv`` in ``trial``'s sandbox."""
    from mcp.client.stdio import StdioServerParameters

    from rl.agent.sandbox.jail import INIT, build_spec, unshare_path

    view = trial._agent_view()
    view = replace(view, ro=view.ro + ((JAIL_HARNESS_DIR, harness_dir),))
    spec = build_spec(argv, view, env={**trial.agent_env(), **env}, uid=trial.uid,
                      rlimits=trial.limits.rlimits(per_process_memory=trial.cgroup is None))
    logs = trial.dir / "logs"
    logs.mkdir(mode=0o700, exist_ok=True)
    spec_path = logs / f"mcp-{uuid.uuid4().hex[:8]}.json"
    fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f)
    launcher = [unshare_path(), "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child",
                *([] if trial.network else ["--net"]), sys.executable, "-I", "-S", INIT, "3"]
    join = "".join(f"echo $$ > {shlex.quote(os.fsdecode(p))}; "
                   for p in (trial.cgroup.procs_files if trial.cgroup is not None else ()))
    script = 'spec="$1"; shift; exec 3<"$spec"; rm -f "$spec"; ' + join + 'exec "$@"'
    return StdioServerParameters(command="/bin/sh", args=["-c", script, "t1ops-mcp", str(spec_path), *launcher],
                                 env={"PATH": "/usr/bin:/bin"}, cwd="/")
