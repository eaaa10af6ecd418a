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
from rl.harness.command_agent import (HarnessOutcome, HarnessSettings, expand_argv, harness_env, harness_python,
                                      outcome, resolve_program_dir, run_in_trial, trial_paths)
from rl.harness.server import OpenAIServer, SessionRegistry
from rl.harness.session import HarnessSession, SessionLimits
from t1ops.config import CampaignConfig


def harness_settings(cfg: CampaignConfig) -> HarnessSettings | None:
    """The worker's harness settings, or None for the builtin agent."""
    if cfg.rollout.agent != "command":
        return None
    h = cfg.harness
    resolve_program_dir(h.program_dir)  # fail at launch, not in every trial
    return HarnessSettings(argv=tuple(h.argv), program_dir=h.program_dir, max_corrections=h.max_corrections,
                           env=tuple(sorted(h.env.items())))


class HarnessHost:
    """The worker's endpoint and the per-trial sessions on it."""

    def __init__(self, settings: HarnessSettings, agent: AgentSettings, renderer, index: int = 0) -> None:
        self.settings, self.agent, self.renderer = settings, agent, renderer
        self.program_dir = resolve_program_dir(settings.program_dir)
        self.python, self.pythonpath = harness_python()
        self.socket_dir = Path(tempfile.mkdtemp(prefix="t1oa-"))   # short: a socket path has <= 107 bytes
        self.registry = SessionRegistry()
        self.server = OpenAIServer(self.registry, uds=self.socket_dir / f"w{index}.sock").start()

    def limits(self) -> SessionLimits:
        a = self.agent
        return SessionLimits(max_turns=a.max_turns, max_new_tokens=a.max_new_tokens, context_window=a.context_window,
                             min_new_tokens=a.min_new_tokens, temperature=a.temperature,
                             max_corrections=self.settings.max_corrections, num_layers=a.num_layers, topk=a.topk)

    def run(self, trial, task, generate, *, sample_id: str, group_id: str) -> HarnessOutcome:
        name = secrets.token_urlsafe(18)
        session = self.registry.add(HarnessSession(name, generate, self.renderer, self.limits(), sample_id=sample_id,
                                                   group_id=group_id, prompt_id=task.name))
        try:
            sock, harness_dir, workspace = trial_paths(trial, socket_path=self.server.uds)
            argv = expand_argv(self.settings.argv, python=self.python, harness=harness_dir)
            env = harness_env(session_url=self.server.session_url(name), session_id=name, socket_path=sock,
                              instruction=task.instruction, workspace=workspace, max_turns=self.agent.max_turns,
                              settings=self.settings, pythonpath=self.pythonpath)
            res = run_in_trial(trial, argv, env, socket_dir=self.socket_dir, harness_dir=self.program_dir)
        finally:
            self.registry.remove(name)
        return outcome(session, res)

    def close(self) -> None:
        self.server.close()
        shutil.rmtree(self.socket_dir, ignore_errors=True)
