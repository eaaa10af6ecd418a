"""Fixtures shared by the campaign tests of this directory."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass
class TinyCampaign:
    run_dir: Path
    tracker_warnings: list = field(default_factory=list)   # TrackerWarning messages the run emitted
    wandb_calls: list = field(default_factory=list)        # what the campaign asked of the failing W&B double


class _BrokenWandbRun:
    """A W&B run whose every call fails (a dropped connection), at the library's boundary."""

    def __init__(self, calls: list) -> None:
        self._calls = calls

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            self._calls.append(name)
            raise ConnectionError("W&B service unreachable")
        return fail


_FAILED: list[BaseException] = []  # pytest re-runs a failed session fixture per test: fail them all on one run


@pytest.fixture(scope="session")
def tiny_campaign(tmp_path_factory) -> TinyCampaign:
    """The examples/tiny campaign at its smallest (2 steps, 4 trajectories, held-out eval every step)
    on a two-node Ray cluster on this machine, run once for every test that reads it. Trackers as a
    user would set them: TensorBoard (the default) and W&B "offline", whose library raises on every
    call through a double: the campaign must finish anyway, with one warning."""
    if _FAILED:
        raise _FAILED[0]
    try:
        return _run_tiny_campaign(tmp_path_factory)
    except BaseException as err:
        _FAILED.append(err)
        raise


def _run_tiny_campaign(tmp_path_factory) -> TinyCampaign:
    import wandb
    from ray.cluster_utils import Cluster

    from t1ops.campaign.launch import run_campaign
    from t1ops.config import load_toml
    from t1ops.tracking import TrackerWarning

    out = TinyCampaign(run_dir=Path())
    cfg = load_toml(REPO / "examples" / "tiny" / "campaign.toml")
    cfg.run.steps = 2
    cfg.rollout.num_workers = 2
    cfg.rollout.batch_size = 4
    cfg.rollout.tasks_dir = str(REPO / "examples" / "families" / "train")
    cfg.trainer.warm_start_steps = 2
    cfg.eval.tasks_dir = str(REPO / "examples" / "families" / "heldout")
    cfg.eval.every_steps, cfg.eval.tasks, cfg.eval.samples_per_task = 1, ["sum-0016", "max-0000"], 2
    cfg.tracking.wandb = "offline"

    def init(**kwargs):
        out.wandb_calls.append("init")
        return _BrokenWandbRun(out.wandb_calls)

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        cfg.run.ray_address = cluster.address
        with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mp.setattr(wandb, "init", init)
            out.run_dir = run_campaign(cfg, out_dir=str(tmp_path_factory.mktemp("tiny")), show_progress=False)
    finally:
        cluster.shutdown()
    out.tracker_warnings = [str(w.message) for w in caught if issubclass(w.category, TrackerWarning)]
    return out
