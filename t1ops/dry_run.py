"""`t1ops run --dry-run`: the effective config and every check `t1ops run` makes before it
starts anything, with no Ray and no run directory (docs/getting-started.md, "Check before launch").

The checks are the launch's own functions (``t1ops.campaign.launch``: the isolation gate, the
task pool and the held-out split, the compact vocabulary; the plan's preflight; a resume's config
and checkpoint checks; the host-memory projection of ``t1ops.guards.hostmem``), called without
side effects. Each is a :class:`t1ops.doctor.Check`: ok, warn (the run starts and says so) or fail
(``t1ops run`` refuses).
"""
from __future__ import annotations

import json
import os
import resource
from pathlib import Path
from typing import Any, Callable

from t1ops.config import CampaignConfig, LoadedConfig
from t1ops.doctor import MIN_NOFILE, Check


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def effective_toml(loaded: LoadedConfig) -> str:
    """The validated config as TOML, each value commented with its source (default, file, --set);
    a None value (TOML has no null) is a comment line."""
    from t1ops.config_errors import all_keys

    leaves = set(all_keys(type(loaded.config)))
    lines: list[str] = []

    def section(data: dict, prefix: str) -> None:
        plain = {k: v for k, v in data.items() if (f"{prefix}.{k}" if prefix else k) in leaves}
        if prefix:
            lines.append(f"\n[{prefix}]")
        for k, v in plain.items():
            key = f"{prefix}.{k}" if prefix else k
            src = loaded.sources.get(key, "file" if any(s.startswith(key + ".") and loaded.sources[s] == "file"
                                                        for s in loaded.sources) else "default")
            resolved = loaded.paths.get(key)
            note = f", written {resolved.written!r}" if resolved and resolved.written != resolved.path else ""
            text = f"# {k} = (none)" if v is None else f"{k} = {_toml_value(v)}"
            lines.append(f"{text:60s} # {src}{note}")
        for k, v in data.items():
            if k not in plain:
                section(v, f"{prefix}.{k}" if prefix else k)

    section(loaded.config.model_dump(), "")
    return "\n".join(lines).lstrip("\n") + "\n"


def _estimate_params(cfg: CampaignConfig, vocab: int) -> tuple[int, int]:
    """(actor, critic) parameters of the campaign's MoE model from its shape (attention, router,
    SwiGLU experts, embeddings; norms left out): what the host-memory projection needs."""
    m = cfg.model
    head_dim = m.hidden_size // m.num_attention_heads
    attn = m.hidden_size * head_dim * (2 * m.num_attention_heads + 2 * m.num_query_groups)
    moe = m.hidden_size * m.num_experts + m.num_experts * 3 * m.hidden_size * m.moe_ffn_hidden_size
    body = m.num_layers * (attn + moe) + vocab * m.hidden_size
    actor = body + vocab * m.hidden_size
    return actor, (body + m.hidden_size if cfg.trainer.mode == "ppo" else 0)


def _run_check(name: str, fn: Callable[[], Check | str]) -> Check:
    from t1ops.errors import T1OpsError

    try:
        out = fn()
    except T1OpsError as err:
        return Check(name, "fail", str(err).replace("\n", " "))
    return out if isinstance(out, Check) else Check(name, "ok", out)


def prestart_checks(loaded: LoadedConfig, *, out_dir: str | None = None, resume: Path | None = None) -> list[Check]:
    """Every check `t1ops run` makes before starting Ray, in its order; nothing is created."""
    from rl.agent.sandbox import probe_isolation
    from rl.agent.sandbox.isolation import require
    from rl.agent.tasks import load_pool
    from t1ops.errors import ConfigError

    cfg: CampaignConfig = loaded.config
    checks: list[Check] = []
    missing = loaded.missing_files()
    checks.append(Check("paths", "fail" if missing else "ok", "; ".join(missing) or ", ".join(
        f"{k} {p.path}" for k, p in loaded.paths.items()
        if k != "harness.program_dir" or cfg.rollout.agent == "command") or "no input paths"))

    def isolation() -> str:
        iso = probe_isolation()
        require(iso, cfg.sandbox.isolation)
        return f"probed {iso.level!r}, sandbox.isolation asks at least {cfg.sandbox.isolation!r}"
    checks.append(_run_check("isolation", isolation))

    pool: list = []

    def tasks() -> str:
        from t1ops.campaign.launch import held_out_tasks, train_task_names

        pool[:] = load_pool(cfg.rollout.tasks_dir)
        held = held_out_tasks(cfg, pool)
        return (f"{len(pool)} tasks in {cfg.rollout.tasks_dir}, {len(train_task_names(pool, cfg))} trained on; "
                + (f"{len(held)} held-out eval tasks" if cfg.eval.every_steps else "eval off"))
    checks.append(_run_check("task_pool", tasks))

    p = cfg.trainer.parallel
    layout = (f"{p.world_size} rank(s) (dp {p.dp}, tp {p.tp}, ep {p.ep}), {cfg.rollout.batch_size} trajectories "
              f"per step in {cfg.rollout.batch_size // cfg.rollout.n_samples_per_prompt} groups, "
              f"{cfg.trainer.mini_batches} optimizer step(s) per step x {cfg.trainer.ppo_epochs} epoch(s)")
    checks.append(Check("layout", "ok", layout))

    if cfg.run.plan:
        def plan() -> str:
            from t1ops.preflight import require_ok
            return f"{cfg.run.plan}: {require_ok(cfg.run.plan).verdict}"
        checks.append(_run_check("plan", plan))

    if resume is not None:
        def resumable() -> str:
            from t1ops.campaign.resume import check_same_campaign, plan_resume

            stored = Path(resume) / "config.json"
            if not stored.is_file():
                raise ConfigError(f"--resume {resume}: {stored} does not exist; point --resume at a run directory")
            check_same_campaign(json.loads(stored.read_text()), json.loads(cfg.model_dump_json()))
            point = plan_resume(Path(resume) / "checkpoints", needs_critic=cfg.trainer.mode == "ppo")
            if point.step >= cfg.run.steps:
                raise ConfigError(f"the run already holds step {point.step} and run.steps is {cfg.run.steps}; "
                                  f"pass --steps N (N > {point.step})")
            return point.message
        checks.append(_run_check("resume", resumable))
    else:
        parent = Path(out_dir or cfg.run.out_dir).absolute()
        existing = next(p for p in (parent, *parent.parents) if p.exists())
        writable = os.access(existing, os.W_OK)
        checks.append(Check("run_dir", "ok" if writable else "fail",
                            f"a new run directory under {parent}" + ("" if writable else f": {existing} is not writable")))

    if pool:
        checks.append(_run_check("memory", lambda: _memory(cfg, pool)))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    checks.append(Check("nofile", "ok" if hard >= MIN_NOFILE else "warn",
                        f"soft {soft}, hard {hard}; t1ops raises soft to hard at start"
                        + ("" if hard >= MIN_NOFILE else f" (hard < {MIN_NOFILE}: raise it, ulimit -Hn)")))
    return checks


def _memory(cfg: CampaignConfig, pool: list) -> Check:
    import psutil

    from rl.chat import ChatRenderer
    from t1ops.campaign.launch import build_vocab
    from t1ops.guards.hostmem import check_projection, project_host_memory

    vocab = build_vocab(pool, ChatRenderer.default(), cfg.model.vocab_size, multiple=cfg.trainer.parallel.tp).size \
        if cfg.engine.compact_vocab else cfg.model.vocab_size
    actor, critic = _estimate_params(cfg, vocab)
    proj = project_host_memory(actor, critic, offload_optimizer=True, sandbox_concurrency=cfg.rollout.max_concurrency,
                               guards=cfg.guards, baseline_bytes=psutil.Process().memory_info().rss,
                               world_size=cfg.trainer.parallel.world_size)
    verdict = check_projection(proj, psutil.virtual_memory().available, cfg.guards.host_ram_warn_fraction)
    return Check("memory", "ok" if verdict.fits else "warn",
                 f"vocabulary {vocab} ids, ~{actor / 1e6:.2f}M actor + {critic / 1e6:.2f}M critic parameters; "
                 + verdict.message)


def render(checks: list[Check]) -> tuple[str, bool]:
    """The check lines and the last line; True when `t1ops run` would start."""
    width = max(len(c.name) for c in checks)
    lines = [f"  {c.status.upper():4s}  {c.name:{width}s}  {c.detail}" for c in checks]
    failed = [c.name for c in checks if c.status == "fail"]
    warned = [c.name for c in checks if c.status == "warn"]
    last = (f"dry run: FAIL: `t1ops run` would refuse to start ({', '.join(failed)})" if failed else
            "dry run: PASS: every pre-start check passed" + (f" (warnings: {', '.join(warned)})" if warned else "")
            + "; nothing was started or written")
    return "\n".join(lines + [last]), not failed
