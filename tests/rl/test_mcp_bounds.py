"""Issue #51, class 5 on the container backend: a task's MCP server is outside data. A deeply
nested reply (the issue's: it crashed `tasks run` with no rows) and an endless one (own) end in
the named verdict ``mcp-not-ready``, one line, and `tasks run` still writes its row."""
from __future__ import annotations

import pytest

from tests.rl.test_sandbox_attack_classes import _one_line, _task

SERVER = """import sys
sys.stdin.readline()
if sys.argv[1] == "deep":
    sys.stdout.write('{"jsonrpc": "2.0", "id": 1, "result": ' + '[' * 200000 + ']' * 200000 + '}\\n')
else:
    chunk = 'x' * 65536
    for _ in range(200):
        sys.stdout.write(chunk)
sys.stdout.flush()
sys.stdin.read()
"""


@pytest.mark.parametrize("mode, why", [("deep", "nests deeper"), ("endless", "without finishing a reply")])
def test_a_hostile_mcp_reply_is_a_named_verdict_and_tasks_run_keeps_its_row(tmp_path, mode, why):
    from rl.agent.container.mcp import McpNotReady
    from rl.agent.sandbox import Sandbox
    from rl.agent.tasks import load_task
    from t1ops.task_runs import run_paths
    from tests.rl.container_support import require_container_runtime

    require_container_runtime()
    src = _task(tmp_path, files={"environment/srv.py": SERVER}, toml_extra=(
        f'\n[[environment.mcp_servers]]\nname = "evil"\ntransport = "stdio"\ncommand = "python3"\n'
        f'args = ["/app/srv.py", "{mode}"]\n'))
    with pytest.raises(McpNotReady, match=why) as refused:
        Sandbox(tmp_path / "sbx", "run-mcp", backend="container").create(load_task(src), 0)
    _one_line(refused.value)
    [row] = run_paths([src], oracle=True, trials_root=tmp_path / "trials", backend="container")
    assert row["source"] == "mcp-not-ready" and why in row["reason"], row
