"""The command agent on a rollout worker: one OpenAI endpoint per worker, one session per trial.

``rollout.agent = "command"`` (docs/harness.md): the worker serves
``/v1/chat/completions`` on a unix socket (a trial's private network namespace
has no route to the host; a path socket is reachable from it). Each trial gets
a session named by an unguessable token, whose generate callable is the
worker's guarded route to the engine pool, so routing, weight versions,
resubmission and the sync barrier apply to harness traffic as to the builtin
loop's. The harness program runs in the trial's sandbox under its budget; its
session's TITO chunks become the trial's trajectory.
"""
from __future__ import annotations

import secrets
import shutil
import tempfile
from pathlib import Path

from rl.agent.loop import AgentSettings
from rl.harness.command_agent import (JAIL_HARNESS_DIR, HarnessOutcome, HarnessSettings, expand_argv, harness_env,
                                      harness_python, outcome, resolve_program_dir, run_in_trial, trial_paths)
from rl.harness.server import OpenAIServer, SessionRegistry
from rl.harness.session import HarnessSession, SessionLimits
from t1ops.config import CampaignConfig


def harness_settings(cfg: CampaignConfig) -> HarnessSettings | None:
    """The worker's harness settings, or None for the builtin agent."""
    if cfg.rollout.agent != "command" and not cfg.mcp.servers:
        return None
    h = cfg.harness
    resolve_program_dir(h.program_dir)  # fail at launch, not in every trial
    return HarnessSettings(argv=tuple(h.argv), program_dir=h.program_dir, max_corrections=h.max_corrections,
                           env=tuple(sorted(h.env.items())), command=cfg.rollout.agent == "command",
                           mcp_servers=tuple((m.name, tuple(m.argv)) for m in cfg.mcp.servers))


class HarnessHost:
    """The worker's endpoint and the per-trial sessions on it; the trials' MCP servers."""

    def __init__(self, settings: HarnessSettings, agent: AgentSettings, renderer, index: int = 0,
                 emission_path: str | Path | None = None) -> None:
        self.settings, self.agent, self.renderer = settings, agent, renderer
        # the OpenAI endpoint's own record of the ids it relayed, per request (the audit's, rl.engines.emission_log)
        self.emission_log = None
        if emission_path is not None:
            from rl.engines.emission_log import EmissionLog

            self.emission_log = EmissionLog(emission_path, by="endpoint")
        self.program_dir = resolve_program_dir(settings.program_dir)
        self.python, self.pythonpath = harness_python()
        self.registry = SessionRegistry()
        self.socket_dir, self.server = None, None
        if settings.command:  # the endpoint is only for a command agent (MCP alone needs none)
            self.socket_dir = Path(tempfile.mkdtemp(prefix="t1oa-"))   # short: a socket path has <= 107 bytes
            self.server = OpenAIServer(self.registry, uds=self.socket_dir / f"w{index}.sock").start()

    def limits(self, agent: AgentSettings | None = None) -> SessionLimits:
        a = agent or self.agent
        return SessionLimits(max_turns=a.max_turns, max_new_tokens=a.max_new_tokens, context_window=a.context_window,
                             min_new_tokens=a.min_new_tokens, temperature=a.temperature,
                             max_corrections=self.settings.max_corrections, num_layers=a.num_layers, topk=a.topk)

    def run(self, trial, task, generate, *, sample_id: str, group_id: str,
            agent: AgentSettings | None = None) -> HarnessOutcome:
        """Run the harness as ``trial``'s agent; ``agent``: this trial's limits (evaluation trials differ)."""
        name = secrets.token_urlsafe(18)
        session = self.registry.add(HarnessSession(name, generate, self.renderer, self.limits(agent), sample_id=sample_id,
                                                   group_id=group_id, prompt_id=task.name))
        session.emission_log = self.emission_log
        try:
            sock, harness_dir, workspace = trial_paths(trial, socket_path=self.server.uds)
            argv = expand_argv(self.settings.argv, python=self.python, harness=harness_dir)
            env = harness_env(session_url=self.server.session_url(name), session_id=name, socket_path=sock,
                              instruction=task.instruction, workspace=workspace,
                              max_turns=(agent or self.agent).max_turns,
                              settings=self.settings, pythonpath=self.pythonpath,
                              mcp_servers=self.mcp_argv(harness_dir))
            res = run_in_trial(trial, argv, env, socket_dir=self.socket_dir, harness_dir=self.program_dir)
        finally:
            self.registry.remove(name)
        return outcome(session, res)

    def mcp_argv(self, harness_dir: str) -> list[tuple[str, list[str]]]:
        """The MCP servers' command lines as the trial sees them (placeholders expanded)."""
        return [(n, expand_argv(a, python=self.python, harness=harness_dir)) for n, a in self.settings.mcp_servers]

    def toolbox(self, trial):
        """The builtin agent's MCP tools for ``trial`` (servers started in its sandbox), or None."""
        if not self.settings.mcp_servers:
            return None
        from rl.harness.mcp_jail import jailed_server
        from rl.harness.mcp_tools import McpToolbox

        env = {"PYTHONPATH": self.pythonpath} if self.pythonpath else {}
        return McpToolbox([(n, jailed_server(trial, argv, env, harness_dir=self.program_dir))
                           for n, argv in self.mcp_argv(JAIL_HARNESS_DIR)])

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            shutil.rmtree(self.socket_dir, ignore_errors=True)
