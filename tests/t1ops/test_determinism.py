"""Deterministic rollouts (docs/determinism.md): each request's sampling seed derives from (run seed,
step, trial, call), and a step's results come in plan order, never arrival order."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from rl.agent.loop import AgentSettings, solution_command, tool_call_text
from rl.agent.tasks import load_task
from rl.chat import IM_END_ID
from rl.engines.protocol import FinishReason, GenerateRequest, GenerateResponse, SamplingParams
from t1ops.campaign.rollouts import plan_position
from t1ops.campaign.trials import TrialSpec, request_seed, seeded
from t1ops.campaign.worker import RolloutWorker, WorkerSettings
from t1ops.config import RolloutConfig, RunConfig
from tests.t1ops.results import trial

REPO = Path(__file__).resolve().parents[2]
TASK = "files-hello"


def test_request_seed_is_a_pure_function_of_seed_step_trial_and_call():
    a = TrialSpec("t", "st2-g1-t", 3)
    assert request_seed(0, 2, a, 0) == request_seed(0, 2, TrialSpec("t", "st2-g1-t", 3), 0)
    others = [request_seed(1, 2, a, 0), request_seed(0, 3, a, 0), request_seed(0, 2, TrialSpec("t", "st2-g1-t", 2), 0),
              request_seed(0, 2, a, 1)]
    assert len({request_seed(0, 2, a, 0), *others}) == 5
    assert all(0 <= s < 2 ** 63 for s in others)


def test_seeded_keeps_a_seed_the_request_already_has():
    req = GenerateRequest(input_ids=(1, 2), sampling_params=SamplingParams(max_new_tokens=4))
    assert seeded(req, 7).sampling_params.sampling_seed == 7
    own = GenerateRequest(input_ids=(1, 2), sampling_params=SamplingParams(max_new_tokens=4, sampling_seed=3))
    assert seeded(own, 7).sampling_params.sampling_seed == 3


def test_plan_position_orders_by_group_then_sample_index():
    order = {"st1-g0-a": 0, "st1-g1-b": 1}
    rows = [trial(f"{g}-s{i}") for g in ("st1-g1-b", "st1-g0-a") for i in (10, 2)]
    got = [r.sample_id for r in sorted(rows, key=lambda r: plan_position(r, order))]
    assert got == ["st1-g0-a-s2", "st1-g0-a-s10", "st1-g1-b-s2", "st1-g1-b-s10"]


class RecordingEngine:
    """Solves the task in two turns; group 0's requests wait until group 1 has finished, so the
    groups finish in the reverse of their plan order. Records every request's sampling seed."""

    def __init__(self, renderer, command: str) -> None:
        self.renderer, self.command = renderer, command
        self.seeds: dict[str, int | None] = {}
        self.g1_done = threading.Event()
        self.lock = threading.Lock()
        self.g1_finished = 0

    def generate(self, req):
        if "-g0-" in req.rid:
            self.g1_done.wait(timeout=30)
        self.seeds[req.rid] = req.sampling_params.sampling_seed
        final = not req.rid.endswith("-t0")
        text = "Done." if final else tool_call_text(self.command)
        if final and "-g1-" in req.rid:
            with self.lock:
                self.g1_finished += 1
                if self.g1_finished == 2:
                    self.g1_done.set()
        ids = tuple(self.renderer.encode(text) + [IM_END_ID])
        return GenerateResponse(output_ids=ids, finish_reason=FinishReason(type="stop", matched=IM_END_ID),
                                weight_version="0", prompt_tokens=len(req.input_ids), completion_tokens=len(ids),
                                output_token_logprobs=tuple(-0.1 for _ in ids))


def _rollout(tmp_path, seed):
    settings = WorkerSettings(agent=AgentSettings(max_turns=2, max_new_tokens=64), run=RunConfig(seed=seed or 0),
                              rollout=RolloutConfig(max_concurrency=4, reward_scale=5.0, seed_requests=seed is not None))
    worker = RolloutWorker(run_id="det-test", trials_root=str(tmp_path / "trials"),
                           tasks_dir=str(REPO / "examples" / "tasks"), settings=settings, router=None)
    engine = RecordingEngine(worker.renderer, solution_command(load_task(REPO / "examples" / "tasks" / TASK).solution))
    worker.engines = engine
    groups = [[TrialSpec(TASK, f"st5-g{g}-{TASK}", i) for i in range(2)] for g in range(2)]
    out = asyncio.run(worker.rollout(5, groups))
    return out.results, engine.seeds, groups


def test_requests_are_seeded_per_trial_and_results_come_in_plan_order(tmp_path):
    results, seeds, groups = _rollout(tmp_path, seed=11)
    assert [r.sample_id for r in results] == [f"{s.group_id}-s{s.sample_idx}" for g in groups for s in g]
    for spec in (s for g in groups for s in g):
        for call in (0, 1):
            assert seeds[f"{spec.group_id}-s{spec.sample_idx}-t{call}"] == request_seed(11, 5, spec, call)


def test_rollout_seed_requests_false_leaves_the_engine_its_own_generator(tmp_path):
    _, seeds, _ = _rollout(tmp_path, seed=None)
    assert seeds and all(s is None for s in seeds.values())
