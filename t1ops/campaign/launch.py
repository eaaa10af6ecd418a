"""Start a campaign's roles on Ray and run it (`t1ops run`).

Order: run directory and telemetry; guards that act before launch (nofile,
host-RAM projection); Ray; the compact vocabulary; the trainer (checkpoint
roles refused before any model is built) and its warm start; the engine router
loaded with the warm-started weights; one rollout worker per Ray node; then
the step loop.
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rl.agent.loop import sft_example, solution_command
from rl.agent.sandbox import require_isolation
from rl.agent.settings import AgentLimits, AgentSettings
from rl.agent.tasks import load_pool
from rl.chat import ENDOFTEXT_ID, IM_END_ID, IM_START_ID, ChatRenderer
from rl.hf.checkpoint import export_vocab
from rl.hf.tokenizer import check_renderer_tokenizer
from rl.vocab import CompactVocab
from t1ops import telemetry
from t1ops.campaign.barrier import engine_barrier
from t1ops.campaign.dataplane import TrajectoryStore
from t1ops.campaign.engines import INITIAL_VERSION, EngineRouter
from t1ops.campaign.evaluation import Evaluator, eval_task_names
from t1ops.campaign.guarding import CampaignGuards
from t1ops.campaign.harness import harness_settings
from t1ops.campaign.progress import Progress
from t1ops.campaign.rank_actors import start_trainer
from t1ops.campaign.ray_start import start_with_retry
from t1ops.campaign.resume import open_for_resume, resumed_summary
from t1ops.campaign.rollouts import Rollouts
from t1ops.campaign.rundir import RunDir
from t1ops.campaign.runner import Campaign, step_loop
from t1ops.campaign.summary import Summary, plot
from t1ops.campaign.worker import RolloutWorker, WorkerSettings
from t1ops.config import CampaignConfig
from t1ops.guards.fds import raise_nofile_limit, ray_runtime_env
from t1ops.preflight import require_ok
from t1ops.runs import mark
from t1ops.tracking import Tracker

# Observations a tiny policy should be able to read back (other output maps to UNK).
_OBSERVATION_TEXTS = ("[exit code 0]", "[exit code 1]", "[exit code 2]", "[stopped: timeout]",
                      "[parse error] your tool call is not valid JSON")


def build_vocab(tasks, renderer: ChatRenderer, full_vocab_size: int, multiple: int = 1) -> CompactVocab:
    """The compact vocabulary: every id the pool's prompts, warm-start examples and the chat
    template produce. Anything else a sandbox prints maps to UNK (input only, never sampled).
    ``multiple`` (the trainer's tp) pads it with the lowest unused tokenizer ids to a size
    tensor parallelism can split by rows (they are real tokens the policy learns not to emit)."""
    ids: set[int] = {IM_START_ID, IM_END_ID, ENDOFTEXT_ID}
    for t in tasks:
        command = solution_command(t.solution) if t.solution else "ls"
        tokens, _ = sft_example(t.instruction, command, renderer)
        ids.update(tokens)
    for text in _OBSERVATION_TEXTS:
        ids.update(renderer.observation_ids([{"role": "tool", "content": text}], IM_END_ID))
    spare = (i for i in range(full_vocab_size) if i not in ids)
    while (len(ids) + 1) % multiple:  # + 1: the UNK row
        ids.add(next(spare))
    return CompactVocab(ids, full_vocab_size, has_unk=True)


def _init_ray(cfg: CampaignConfig):
    if not ray.is_initialized():
        address = cfg.run.ray_address
        if address is None and not os.environ.get("RAY_ADDRESS"):
            # a cluster of our own, never one another process on this host started and left in
            # /tmp/ray/ray_current_cluster (ray.init(address=None) would join that one)
            address = "local"
        _quiet_auth_notice()
        own = address == "local"

        def start() -> None:
            with worker_env_while_ray_starts(WORKER_ENV if own else {}):
                ray.init(address=address, num_cpus=None if cfg.run.ray_address else cfg.run.num_cpus,
                         include_dashboard=False, log_to_driver=False, configure_logging=False,
                         **_cluster_kwargs(own))

        if own:  # a node of our own whose start timed out under load is started again (ray_start.py)
            start_with_retry(start)
        else:
            start()
    return ray


@contextlib.contextmanager
def worker_env_while_ray_starts(values: dict[str, str]):
    """``values`` in this process's environment while Ray starts (what the raylet it spawns inherits),
    then those keys as they were, and only those. ``ray.init`` itself sets ``RAY_AUTH_MODE=token``
    here and keeps token authentication on in this process: restoring the whole environment
    (``unittest.mock.patch.dict``) dropped it, and the next cluster this process started destroyed
    every actor before it ran (docs/testing.md, "Flakes")."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


WORKER_ENV = {"OMP_NUM_THREADS": "1"}


def _cluster_kwargs(own: bool) -> dict:
    """How every Ray worker of the campaign gets one OpenMP thread and the raised nofile limit.

    On a cluster of our own, by inheritance: the raylet is started by ``ray.init`` from this process,
    whose soft nofile limit is already raised (:func:`run_campaign`) and whose environment carries
    :data:`WORKER_ENV` while Ray starts, so every worker it spawns has both; and no idle workers are
    prestarted (the campaign starts its own actors; idle ones only imported ray). A job-level
    ``runtime_env`` would start each worker through Ray's ``setup_worker.py``, one more interpreter
    per actor (0.6 CPU-s each, ``bench/bench_ray_start.py``). On a cluster someone else started
    (``run.ray_address``), whose raylets we did not spawn, the job's ``runtime_env`` carries the
    same settings to every node (docs/campaign.md, "Ray's lifetime")."""
    if not own:
        return {"runtime_env": ray_runtime_env({"env_vars": dict(WORKER_ENV)})}
    return {"_system_config": {"prestart_worker_first_driver": False}}


_AUTH_NOTICE = "Token authentication is enabled for this Ray cluster"


class _DropAuthNotice(logging.Filter):
    """Ray's notice that a new local cluster uses token authentication, its default: the choice is
    the secure one, and the notice reads as a warning in a healthy run. RAY_AUTH_MODE would silence
    it only when set before ``import ray``, which a library cannot promise (docs/campaign.md)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_AUTH_NOTICE)


def _quiet_auth_notice() -> None:
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _DropAuthNotice) for f in logger.filters):
        logger.addFilter(_DropAuthNotice())


def start_roles(c: Campaign, progress: Progress) -> Campaign:
    """Fill ``c`` with running roles (so a failure half-way still lets the caller shut them down)."""
    cfg, run = c.cfg, c.run
    _init_ray(cfg)

    tasks = load_pool(cfg.rollout.tasks_dir)
    c.eval_tasks = held_out_tasks(cfg, tasks)  # refused before any role starts when not held out
    renderer = ChatRenderer.default()
    if c.resume_from is None:
        # a checkpoint written with a compact vocabulary (a t1ops export) brings its own ids (docs/model.md)
        if cfg.model.path:
            check_renderer_tokenizer(cfg.model.path)
        vocab = export_vocab(cfg.model.path) if cfg.model.path else None
        if vocab is None:
            vocab = build_vocab(tasks, renderer, cfg.model.vocab_size, multiple=cfg.trainer.parallel.tp) \
                if cfg.engine.compact_vocab else CompactVocab.identity(cfg.model.vocab_size)  # a real server samples all
        vocab.save(run.vocab)
    else:  # the run's own ids: its checkpoints index them
        vocab = CompactVocab.load(run.vocab)
    spec = {**cfg.model.model_spec().to_dict(), "vocab_size": vocab.size}
    progress.log(f"run {run.run_id}: {len(tasks)} tasks, {'compact' if cfg.engine.compact_vocab else 'full'} "
                 f"vocabulary {vocab.size} ids, dir {run.path}")
    c.trainer, rank_watch = start_trainer(cfg, run, spec)  # one path for every world size
    if cfg.trainer.parallel.world_size > 1:
        p = cfg.trainer.parallel
        progress.log(f"trainer: {p.world_size} ranks (dp {p.dp}, tp {p.tp}, pp {p.pp}, cp {p.cp}, ep {p.ep})")
    # The engines start now, from the model's seeded weights (as SGLang starts from the base model),
    # while the trainer warm-starts or loads the resumed checkpoint; version 0 (or the resumed step)
    # reaches them through the normal weight sync below. Calls on the trainer actor run in order. (The
    # workers start after the warm start: on a 2-core host their imports slowed it more than they saved.)
    c.sender, sender_ready = _configure_weight_sender(cfg, c.trainer, run)
    if c.resume_from is None:
        examples = warm_start_examples(tasks, cfg.trainer.warm_start_noise, cfg.run.seed)
        warm = c.trainer.warm_start(examples, cfg.trainer.warm_start_steps)
        first = c.trainer.publish(0)
    else:
        first = c.trainer.resume(c.resume_from)
    # named: a rollout worker (restartable) looks the router up by name rather than taking its handle
    # as a constructor argument, which Ray reports as an error at creation (ray-project/ray#53727)
    c.router = ray.remote(EngineRouter).options(name=f"t1ops-router-{run.run_id}", num_cpus=0,
                                                max_concurrency=256).remote(
        engine_cfg=cfg.engine.model_dump(), spec=spec, vocab_path=str(run.vocab), checkpoint_dir=None,
        num_moe_layers=cfg.model.num_layers, topk=cfg.model.moe_router_topk,
        num_experts=cfg.model.num_experts, log_path=str(run.path / "engines.log"), run_dir=str(run.path),
        version=INITIAL_VERSION,
        telemetry_cfg=_telemetry_kw(cfg), pause_mode="in_place" if cfg.pipeline_mode == "fully_async" else "abort")
    ray.get(sender_ready)
    if c.resume_from is None:
        c.warm_start_loss = ray.get(warm)
        if c.warm_start_loss:
            progress.log(f"warm start: {len(c.warm_start_loss)} supervised steps, loss "
                         f"{c.warm_start_loss[0]:.2f} -> {c.warm_start_loss[-1]:.2f}")
        ckpt0 = ray.get(first)
    else:
        loaded = ray.get(first)
        ckpt0 = loaded["actor"]
        critic = f" and critic {loaded['critic']}" if loaded["critic"] else ""
        ranks = cfg.trainer.parallel.world_size
        resharded = (loaded.get("loaded") or {}).get("trainer_state") == "re-sharded"
        progress.log(f"resumed at step {c.resume_from}: actor {loaded['actor']}{critic} loaded and verified, "
                     f"optimizer state and RNG of {ranks} rank{'s' if ranks > 1 else ''} and trainer step "
                     f"{loaded['trainer_step']} restored" + (" (saved at another layout: weights and optimizer "
                                                            "re-sharded)" if resharded else "")
                     + f"; next step {loaded['next_step']}")
        telemetry.event("campaign.resumed", **loaded)
    settings = _worker_settings(cfg)
    store = None  # the trajectories' owner: outlives any worker (t1ops.campaign.dataplane)
    if cfg.rollout.data_plane == "object_store":  # named, as the router: workers look it up (ray#53727)
        store = f"t1ops-trajectories-{run.run_id}"
        c.store = ray.remote(TrajectoryStore).options(name=store, num_cpus=0).remote()
    for index, node in enumerate([n for n in ray.nodes() if n["Alive"]][: cfg.rollout.num_workers]):
        c.workers.append(ray.remote(RolloutWorker).options(  # a killed worker restarts; its rollout reruns
            num_cpus=0, max_restarts=2, max_task_retries=2, scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(
            run_id=run.run_id, trials_root=str(run.trials_root), tasks_dir=str(Path(cfg.rollout.tasks_dir).resolve()),
            settings=settings, router=f"t1ops-router-{run.run_id}", node=node["NodeManagerAddress"] + ":" + node["NodeID"][:8],
            run_dir=str(run.path), index=index, telemetry_cfg=_telemetry_kw(cfg), store=store))
    progress.log("engines: " + ray.get(c.router.wait_until_live.remote()))
    with engine_barrier(c.router, c.resume_from or 0, ckpt0) as barrier:
        barrier.push_from(c.sender)
    first_sync = barrier.report
    progress.log(f"weights of step {c.resume_from or 0} synced to engines {first_sync['live']} "
                 f"in {first_sync['duration_s']:.2f} s")
    c.guards = CampaignGuards(cfg, run.path, dead_engines=lambda: ray.get(c.router.dead_engines.remote()),
                              pids=lambda: [os.getpid(), *ray.get(c.router.engine_pids.remote()),
                                            *(c.rollouts.pids if c.rollouts else [])],
                              roles=lambda: {"coordinator": os.getpid(),
                                             **{f"engine-{i}": p for i, p in enumerate(ray.get(c.router.engine_pids.remote()))},
                                             **{f"worker-{i}": p for i, p in enumerate(c.rollouts.pids if c.rollouts else [])}})
    progress.log("host memory: " + c.guards.project_host_memory(*ray.get(c.trainer.num_params())))
    if rank_watch is not None:
        c.guards.attach_ranks(rank_watch)
    else:
        pid = ray.get(c.trainer.sender.install_stack_dump.remote(str(run.path / "trainer-stacks.txt")))
        c.guards.attach_trainer(pid, run.path / "trainer-stacks.txt")
    ray.get([w.ping.remote() for w in c.workers])
    c.rollouts = Rollouts(cfg, c.workers, train_task_names(tasks, cfg), c.guards.stall)
    if c.eval_tasks:
        progress.log(f"held-out eval: {len(c.eval_tasks)} tasks x {cfg.eval.samples_per_task} every "
                     f"{cfg.eval.every_steps} steps ({'greedy' if cfg.eval.greedy else f'T={cfg.eval.temperature}'})")
    return c


def held_out_tasks(cfg: CampaignConfig, tasks) -> list[str]:
    """The evaluation task names (empty when eval is off); ConfigError unless held out."""
    if cfg.eval.every_steps == 0:
        return []
    eval_pool = load_pool(cfg.eval.tasks_dir) if cfg.eval.tasks_dir else None
    return eval_task_names(cfg, tasks, train_task_names(tasks, cfg), eval_pool)


def _configure_weight_sender(cfg: CampaignConfig, trainer, run: RunDir):
    """The trainer's side of the weight sync (t1ops.guards.weight_sync): every rank sends its own shard
    (configured on each); rank 0 drives the push. Returns rank 0 and the call that configures it
    (submitted, not awaited)."""
    e = cfg.engine
    group, trainer = trainer, trainer.sender
    group.configure_weight_sender(
        dtype=e.dtype, bucket_bytes=int(e.weight_sync_bucket_mb * (1 << 20)), master_address=e.weight_sync_master_address,
        timeout_s=e.weight_sync_timeout_s, export_dir=str(run.path / "hf_exports"))
    ready = trainer.configure_weight_push.remote(  # calls on one actor run in order: after the line above
        engine_cfg=e.model_dump(), client_kw=dict(num_moe_layers=cfg.model.num_layers, topk=cfg.model.moe_router_topk,
                                                  num_experts=cfg.model.num_experts))
    return trainer, ready


def warm_start_examples(tasks, noise: float, seed: int) -> list[tuple[str, str]]:
    """(instruction, command) demonstrations from an imperfect demonstrator.

    Every task's own solution, plus for a ``noise`` share of the demonstrations
    another task's solution under this task's instruction. The warm-started
    policy then solves some but not all of its attempts, as the report's RL
    starts from an SFT checkpoint that solves some tasks: RL has room to improve.
    """
    solved = [t for t in tasks if t.solution]
    own = [(t.instruction, solution_command(t.solution)) for t in solved]
    num_wrong = round(len(own) * noise / (1 - noise))
    rng = random.Random(seed)
    wrong = []
    for i in range(num_wrong):
        t, other = solved[i % len(solved)], solved[(i % len(solved) + 1 + rng.randrange(len(solved) - 1)) % len(solved)]
        wrong.append((t.instruction, solution_command(other.solution)))
    return own + wrong


def _telemetry_kw(cfg: CampaignConfig) -> dict:
    return {"otlp_endpoint": cfg.telemetry.otlp_endpoint, "export_interval_s": cfg.telemetry.export_interval_s}


def train_task_names(tasks, cfg: CampaignConfig) -> list[str]:
    """The tasks RL samples from: the whole pool, or a fixed seeded subset (``num_train_tasks``)."""
    names = sorted(t.name for t in tasks)
    n = cfg.rollout.num_train_tasks
    return names if n is None or n >= len(names) else sorted(random.Random(cfg.run.seed).sample(names, n))


def _worker_settings(cfg: CampaignConfig) -> WorkerSettings:
    r = cfg.rollout
    agent = AgentSettings(**r.model_dump(include=set(AgentLimits.model_fields)),  # declared once: AgentLimits
                          num_layers=cfg.model.num_layers if cfg.trainer.r3 else None,
                          topk=cfg.model.moe_router_topk if cfg.trainer.r3 else None)
    return WorkerSettings.from_config(cfg, agent, harness_settings(cfg))  # the sections as they are, typed


def run_campaign(cfg: CampaignConfig, *, out_dir: str | None = None, show_progress: bool = True,
                 on_step: list | None = None, resume: str | Path | None = None) -> Path:
    """Run a whole campaign; returns the run directory (summary.json, report.png, dumps, ...).

    ``on_step`` callables ``(campaign, step)`` run as each step starts (the chaos schedule's seam).
    ``resume``: continue that run directory from its newest verified step (``t1ops.campaign.resume``)."""
    require_isolation(cfg.sandbox.isolation)   # before anything starts: never weaker than asked
    held_out_tasks(cfg, load_pool(cfg.rollout.tasks_dir))   # a bad pool: refused before any run dir or Ray
    previous, point = None, None
    if resume is None:
        run = RunDir.create(out_dir or cfg.run.out_dir, cfg.run.name)
    else:  # refused (config, checkpoints, steps) before anything starts
        run, point, previous = open_for_resume(resume, cfg)
    (run.path / "config.json").write_text(cfg.model_dump_json(indent=2))
    mark(run.path, "running", steps=cfg.run.steps)   # `t1ops runs` (t1ops.runs)
    telemetry.setup(run.path, **_telemetry_kw(cfg))
    raise_nofile_limit()
    progress = Progress(cfg.run.steps, enabled=show_progress)
    c = Campaign(cfg=cfg, run=run, resume_from=point.step if point else None)
    tracker = None
    try:
        if point is not None:
            progress.log(point.message)
            telemetry.event("campaign.resume_point", step=point.step, message=point.message)
        if cfg.run.plan:  # refuse a plan that cannot work before any GPU-second is spent
            progress.log(f"preflight: {cfg.run.plan}: {require_ok(cfg.run.plan).verdict}")
        start_roles(c, progress)
        c.on_step = list(on_step or [])
        summary = Summary(run.path, run.run_id, cfg.model_dump(),
                          extra={"warm_start_loss": c.warm_start_loss, "num_workers": len(c.workers),
                                 "eval_tasks": c.eval_tasks, "train_tasks": c.rollouts.task_names})
        if previous is not None:
            resumed_summary(summary, previous, point)
        summary.tracker = tracker = Tracker.open(cfg.tracking, run.path, run.run_id, cfg.model_dump(),
                                                 resume_step=point.step if point else None)
        if c.eval_tasks:
            c.evaluator = Evaluator(cfg, c.workers, c.eval_tasks, summary.add_eval)
        with progress:
            step_loop(c, summary, progress)
        tracker.report(plot(summary.save()), cfg.run.steps)
        mark(run.path, "finished", steps=cfg.run.steps)
        return run.path
    except BaseException as err:
        mark(run.path, "crashed", error=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300])
        raise
    finally:
        if tracker is not None:
            tracker.close()
        _shutdown(c)
        telemetry.shutdown()


def _shutdown(c: Campaign | None) -> None:
    if c is not None and c.router is not None:
        try:
            ray.get(c.router.close.remote(), timeout=30)
        except Exception as err:  # still shut Ray down; the engines die with their parent
            telemetry.event("campaign.shutdown_error", severity="warn", error=str(err))
    if c is not None and c.guards is not None:
        c.guards.stop()
    for w in (c.workers if c is not None else []):   # in-flight trials: unmount before the kill
        try:
            ray.get(w.close_trials.remote(), timeout=30)
        except Exception as err:
            telemetry.event("campaign.shutdown_error", severity="warn", error=f"close_trials: {err}")
    if ray.is_initialized():
        ray.shutdown()
    os.environ.pop("RAY_ADDRESS", None)
    if c is not None:   # trials of workers killed mid-trial (chaos, crashes): every worker is gone now
        from rl.agent.sandbox.trial import release_under

        freed = release_under(c.run.trials_root)
        if freed:
            telemetry.event("campaign.trials_released", severity="warn", count=freed)
