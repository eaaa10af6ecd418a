"""Real trainer ranks for the distributed chaos scenarios (jit-as-deadlock, gloo-default-timeout).

``python -m chaos.rank_job '<json>'`` is one rank process of a 2-rank tiny
trainer: it builds the layout-free initial weights and a deterministic batch
in a world of 1, joins its world, builds its ``RankTrainer`` shard with a
progress beacon, a faulthandler stack dump (SIGUSR1) and, when guarded, the
collective watch; then takes the training steps and the checkpoint save that
``TrainerHost.publish`` runs inside the weight-update barrier at a resume point
(``save_sharded``: every rank writes its shard, rank 0 gathers the entries and
commits; watched as "sharded checkpoint save", as the trainer host does). Guarded, the
world and megatron's groups come from ``t1ops.campaign.trainer_rank.join_world``
with the (scaled) configured timeout. Unguarded, they are created the way
code without the guard does it: no timeout argument, so torch's implicit
default applies; the scenario shortens that default through torch's own knob
(``torch.distributed.distributed_c10d.default_pg_timeout``) and megatron's
groups get the same default.

Faults, on rank ``fault_rank`` only, are real delays inside the real step:
``compile_curve_s`` (a sleep before each of the first forwards, as a cold
kernel compile: its peers wait inside the MoE dispatcher's all-gather),
``hang_after_forwards`` (blocks forever in ``_stuck_compiling`` from that
forward on) and ``stall_before_gather_s`` (late at the checkpoint save's gather).
Each rank writes ``<out>/rank<r>.json``.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cold_compile(delay_s: float) -> None:
    time.sleep(delay_s)  # a rank compiling kernels: its peers wait in the collective


def _stuck_compiling() -> None:
    threading.Event().wait()  # never returns: the rank the watchdog must call hung


def _install_faults(models, cfg: dict) -> None:
    curve, hang_after = list(cfg.get("compile_curve_s") or []), cfg.get("hang_after_forwards")
    count = [0]

    def hook(_module, _args, _kwargs):
        count[0] += 1
        if hang_after is not None and count[0] > hang_after:
            _stuck_compiling()
        if count[0] <= len(curve):
            _cold_compile(curve[count[0] - 1])

    for m in models:
        m.register_forward_pre_hook(hook, with_kwargs=True)


def _world_of_one(cfg: dict):
    """Initial weights and the batch, identical on every rank (same seeds), in a world of 1."""
    import numpy as np
    import torch

    from rl import model as rmodel
    from rl.megatron_cpu import init_single_process, teardown
    from rl.trainer import Trainer, TrainerSettings, rollout_batch, sample_responses

    spec = rmodel.ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                            num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, max_seq_len=64, vocab_size=64)
    settings = TrainerSettings(mode="ppo", ppo_epochs=1, r3=True)
    init_single_process()
    t = Trainer(spec, settings, seed=0)
    seqs = sample_responses(t.actor, [[1, 2, 3, 4]] * 8, 10, generator=torch.Generator().manual_seed(0))
    seqs = [np.asarray(s[: 8 + (i % 4) * 2]) for i, s in enumerate(seqs)]
    batch = rollout_batch(t.actor, seqs, [4] * 8, [0.1 * i for i in range(8)], [i // 2 for i in range(8)],
                          [i // 2 for i in range(8)])
    states = (rmodel.weights_state_dict(t.actor), rmodel.weights_state_dict(t.critic))
    teardown()
    return spec, settings, batch, states


def _join(cfg: dict, layout, guards) -> float:
    import torch.distributed as tdist
    import torch.distributed.distributed_c10d as c10d

    from t1ops.campaign.trainer_rank import join_world

    if cfg["guarded"]:
        return join_world(cfg["rank"], cfg["world"], cfg["init_method"], layout, guards=guards,
                          timeout=timedelta(seconds=cfg["timeout_s"])).total_seconds()
    from megatron.core import parallel_state

    from rl.megatron_cpu import apply_cpu_shims

    apply_cpu_shims()
    c10d.default_pg_timeout = timedelta(seconds=cfg["timeout_s"])  # the real knob, shortened
    tdist.init_process_group("gloo", init_method=cfg["init_method"], rank=cfg["rank"], world_size=cfg["world"])
    default_min = c10d.default_pg_timeout.total_seconds() / 60  # megatron's groups: the same default
    parallel_state.initialize_model_parallel(layout.tp, layout.pp, expert_model_parallel_size=layout.ep,
                                             expert_tensor_parallel_size=1, distributed_timeout_minutes=default_min,
                                             create_gloo_process_groups=False)
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(0)
    return cfg["timeout_s"]


def rank_main(cfg: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    from rl.trainer.ranks import Layout, RankTrainer
    from t1ops.config import GuardsConfig
    from t1ops.guards.dist import watch_collective
    from t1ops.guards.sharded_checkpoints import save_sharded
    from t1ops.guards.rank_watch import ProgressBeacon
    from t1ops.guards.watchdog import install_stack_dump

    out_dir, rank = Path(cfg["out"]), cfg["rank"]
    stacks = install_stack_dump(out_dir / f"rank{rank}.stacks")  # noqa: F841 (kept open)
    spec, settings, batch, (actor, critic) = _world_of_one(cfg)
    layout, guards = Layout(**cfg["layout"]), GuardsConfig()
    result = {"rank": rank, "error": None, "steps_done": 0, "slow": [], "gather_s": None}
    watches: list = []

    def watch(name):
        w = watch_collective(name, timedelta(seconds=cfg["timeout_s"]), slow_fraction=guards.collective_slow_fraction)
        watches.append(w)
        return w

    # line the ranks up before the rendezvous: a scaled-down timeout must time the fault, not start-up
    (out_dir / f"ready{rank}").touch()
    while not all((out_dir / f"ready{r}").exists() for r in range(cfg["world"])):
        time.sleep(0.01)
    try:
        result["timeout_s"] = _join(cfg, layout, guards)
        result["work_at"] = time.monotonic()  # system-wide clock: the parent times the fault from it
        rt = RankTrainer(spec, settings, layout, full_actor=actor, full_critic=critic, unk_id=None,
                         on_micro_batch=ProgressBeacon(out_dir / f"rank{rank}.progress"),
                         watch=watch if cfg["guarded"] else None)
        if rank == cfg.get("fault_rank"):
            _install_faults([rt.actor, rt.critic], cfg)
        for _ in range(cfg.get("steps", 1)):
            rt.train_step(batch)
            result["steps_done"] += 1
            result.setdefault("first_step_at", time.monotonic())
        if rank == cfg.get("fault_rank") and cfg.get("stall_before_gather_s"):
            time.sleep(cfg["stall_before_gather_s"])  # the slow rank at the weight-update barrier
        t0 = time.monotonic()
        with watch("sharded checkpoint save") if cfg["guarded"] else contextlib.nullcontext():
            committed = save_sharded(out_dir / "checkpoints", "actor", cfg.get("steps", 1), rt)
        result["gather_s"] = time.monotonic() - t0
        result["committed"] = None if committed is None else str(committed)
    except Exception as err:  # what the job log shows
        result["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    result["slow"] = [{"collective": w.name, "slow_at_s": w.slow_at_s} for w in watches if w.slow_at_s is not None]
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    return result


def spawn(out_dir: Path, cfg: dict, world: int = 2) -> list[subprocess.Popen]:
    """Start ``world`` rank processes of one job (``cfg`` shared; rank and rendezvous added)."""
    from rl.engines.ports import free_port

    out_dir.mkdir(parents=True, exist_ok=True)
    init = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return [subprocess.Popen([sys.executable, "-m", "chaos.rank_job",
                              json.dumps({**cfg, "rank": r, "world": world, "init_method": init, "out": str(out_dir)})],
                             cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for r in range(world)]


def results(out_dir: Path, procs: list[subprocess.Popen], timeout_s: float = 300.0) -> list[dict]:
    """Wait for the rank processes; each rank's report plus its exit code."""
    reps = []
    for r, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        path = out_dir / f"rank{r}.json"
        rep = json.loads(path.read_text()) if path.exists() else {"rank": r, "error": (err or "")[-300:]}
        reps.append({**rep, "returncode": p.returncode})
    return reps


if __name__ == "__main__":
    sys.exit(1 if rank_main(json.loads(sys.argv[1]))["error"] else 0)  # a failed rank fails the job
