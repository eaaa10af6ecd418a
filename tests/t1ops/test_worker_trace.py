"""A rollout worker (no Ray) traces every trial and reports the phase seconds of the split."""
from __future__ import annotations

import asyncio
from pathlib import Path

from rl.agent.loop import AgentSettings, solution_command, tool_call_text
from rl.agent.tasks import load_task
from rl.chat import IM_END_ID, ChatRenderer
from rl.engines.protocol import FinishReason, GenerateResponse
from t1ops import telemetry
from t1ops.campaign.trialtrace import read_trial_spans, step_split
from t1ops.campaign.worker import RolloutWorker, TrialSpec, WorkerSettings
from t1ops.config import RolloutConfig

REPO = Path(__file__).resolve().parents[2]
TASK = "files-hello"


class ScriptedEngine:
    """Answers turn 1 with the task's solution as a tool call, turn 2 with "Done."."""

    def __init__(self, renderer: ChatRenderer, command: str) -> None:
        self.renderer, self.command = renderer, command

    def generate(self, req):
        text = tool_call_text(self.command) if req.rid.endswith("-t0") else "Done."
        ids = tuple(self.renderer.encode(text) + [IM_END_ID])
        return GenerateResponse(output_ids=ids, finish_reason=FinishReason(type="stop", matched=IM_END_ID),
                                weight_version="0", prompt_tokens=len(req.input_ids), completion_tokens=len(ids),
                                output_token_logprobs=tuple(-0.1 for _ in ids))


def test_every_trial_has_spans_and_phase_seconds(tmp_path):
    settings = WorkerSettings(agent=AgentSettings(max_turns=2, max_new_tokens=64),
                              rollout=RolloutConfig(max_concurrency=2, reward_scale=5.0))
    worker = RolloutWorker(run_id="trace-test", trials_root=str(tmp_path / "trials"),
                           tasks_dir=str(REPO / "examples" / "tasks"), settings=settings, router=None,
                           run_dir=str(tmp_path), index=0)
    task = load_task(REPO / "examples" / "tasks" / TASK)
    worker.engines = ScriptedEngine(worker.renderer, solution_command(task.solution))
    groups = [[TrialSpec(TASK, "st1-g0", i) for i in range(3)]]
    try:
        with telemetry.span("rollout.submit", step=1):
            carrier = telemetry.trace_carrier()
        out = asyncio.run(worker.rollout(1, groups, trace=carrier))
    finally:
        telemetry.shutdown()
    results = out.results
    assert len(results) == 3 and all(r.reward > 0 for r in results)
    assert all(r.generate_s > 0 and r.sandbox_s > 0 and r.verify_s > 0 for r in results)
    split = step_split(results, rollout_s=1.0)
    assert 0 < split["verify_share"] < 1 and split["trial_s"] > 0
    spans = read_trial_spans(tmp_path)
    assert set(spans) == {r.trial_id for r in results}
    for trial in spans.values():
        assert trial["names"].count("agent.turn") == 2 and trial["names"].count("generate") == 2
        assert {"sandbox.create", "sandbox.exec", "sandbox.finish", "verify", "reward"} <= set(trial["names"])
        assert trial["root"] == "rollout.submit" and trial["root_step"] == 1
