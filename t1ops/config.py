"""Typed campaign configuration, loaded from TOML.

One tree of pydantic models; every field carries a one-line description and
its allowed range. Unknown keys and out-of-range values raise
:class:`~t1ops.errors.ConfigError` naming the dotted key and what is allowed.
Sections own their concern: add fields to the section that uses them.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from rl.agent.bounded import check_nesting, short
from rl.agent.settings import AgentLimits
from rl.trainer.settings import Layout, TrainerSettings
from t1ops.config_engine_checks import EngineChecks
from t1ops.config_errors import FileKind, explain
from t1ops.config_model import ModelConfig
from t1ops.config_paths import RELATIVE_NOTE, ResolvedPath, check_files, resolve
from t1ops.config_section import Section
from t1ops.errors import ConfigError
from t1ops.guards.field_config import FieldGuardsConfig, RunHealthConfig
from t1ops.parallel_layout import trainer_errors


class RunConfig(Section):
    name: str = Field("tiny", description="Run name; the run id is '<name>-<timestamp>'.")
    out_dir: str = Field("runs", description="Parent directory of run directories (an output: relative to the working directory; `t1ops run --out` overrides it).")
    seed: int = Field(0, ge=0, description="Seed for sampling, task order and chaos schedules.")
    steps: int = Field(8, ge=1, le=100_000, description="RL steps to run (after warm start).")
    ray_address: str | None = Field(None, description="Ray cluster address; None starts a local Ray.")
    num_cpus: int | None = Field(None, ge=1, description="CPUs for a local Ray (None: all).")
    mode: Literal["sync", "one_step", "fully_async"] = Field("one_step", description="Step pipeline: 'sync' (generate, then train), 'one_step' (batch t+1 generates while step t trains), 'fully_async' (group workers generate continuously within the staleness budget, [fully_async] section; docs/async.md).")
    plan: str | None = Field(None, description="Cluster plan (TOML) that `t1ops preflight` must accept before launch (None: no gate). " + RELATIVE_NOTE)


class EngineConfig(Section, EngineChecks):  # + the barrier's proofs (t1ops.config_engine_checks)
    kind: Literal["embedded", "sglang"] = Field("embedded", description="Embedded CPU engine or external SGLang servers.")
    num_engines: int = Field(1, ge=1, le=1024, description="Engines to run (embedded) or expect (sglang).")
    urls: list[str] = Field(default_factory=list, description="SGLang server URLs when kind = 'sglang'.")
    dtype: Literal["bfloat16", "float32"] = Field("bfloat16", description="Engine precision; differs from the trainer's fp32 as SGLang's does.")
    health_interval_s: float = Field(2.0, gt=0, le=600, description="Seconds between /health_generate pings.")
    failure_threshold: int = Field(3, ge=1, le=100, description="Consecutive failed pings before an engine is declared dead.")
    warmup_grace_s: float = Field(120.0, ge=0, description="Missed pings tolerated this long after engine start (first compile).")
    request_timeout_s: float = Field(5.0, gt=0, le=3600, description="Timeout of one control-plane HTTP call.")
    request_attempts: int = Field(3, ge=1, le=20, description="Attempts of a control-plane call before it fails.")
    generate_timeout_s: float = Field(600.0, gt=0, description="Timeout of one /generate call.")
    retry_backoff_s: float = Field(0.5, ge=0, le=60, description="Base of the exponential backoff between control-plane attempts.")
    max_resubmits: int = Field(3, ge=0, le=100, description="Times a request is resubmitted after its engine died before it fails loudly.")
    compact_vocab: bool = Field(True, description="Embedded tiny model only: trainer and engines work over the pool's ids (rl.vocab; a 2-core CPU cannot afford 248,320 logits per position); false = the tokenizer's full vocabulary (required with kind = 'sglang').")
    weight_sync: Literal["disk", "distributed"] = Field("disk", description="How the barrier moves weights: 'disk' = Hugging Face export + /update_weights_from_disk; 'distributed' = /init_weights_update_group + /update_weights_from_distributed (docs/weights.md).")
    weight_sync_backend: Literal["gloo", "nccl"] | None = Field(None, description="torch.distributed backend of distributed sync (None: gloo for embedded engines, nccl for SGLang servers).")
    weight_sync_master_address: str = Field("127.0.0.1", description="Address the engines reach the trainer at (rank 0 of the weight-update group).")
    weight_sync_bucket_mb: float = Field(512.0, gt=0, description="Bytes per /update_weights_from_distributed request (MiB), never splitting a tensor's conversion unit.")
    weight_sync_timeout_s: float = Field(600.0, gt=0, description="Timeout of the weight-update group (forming it, each broadcast).")
    weight_sync_delta: bool = Field(True, description="Distributed sync to embedded engines: after a full push, send only the tensors/elements that changed since the version every engine holds (rl.weights.delta; docs/weights.md 'Delta sync'); a new, restarted or mismatching engine gets the full weights. SGLang servers always get full pushes (the delta fields are a t1ops extension).")
    kv_slots: int = Field(128, ge=1, le=4096, description="Embedded engine: K/V cache slots (one running request each; a request waits when all are held; capped to the engine's 1 GiB cache budget). Its peak use is the step row's kv_cache_peak (health.kv-cache).")
    batching: bool = Field(True, description="Embedded engine: K/V cache, continuous batching and prefix reuse (docs/engine.md); false recomputes the whole sequence per token, one request at a time (the old path, for benchmarks).")
    batch_invariant: bool = Field(False, description="Embedded engine: each forward carries one request and no prefix is reused, so a request's tokens depend on its prompt, seed and the weights only, never on what it was batched with (batched inference is not bit-stable across batch compositions). Part of the deterministic configuration (docs/determinism.md); costs the batching's throughput.")


class ParallelConfig(Layout, Section):
    """The trainer's layout on its ranks (docs/parallelism.md): ``rl.trainer.settings.Layout`` and the
    process-group backend. Checked at load against the model by the same rules preflight applies
    to plans (``t1ops.parallel_layout``)."""

    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="Process-group backend: auto = nccl with CUDA, gloo on CPU.")


class TrainerConfig(TrainerSettings, Section):
    """The ``[trainer]`` section: the step's settings (``rl.trainer.settings``) and the rank layout."""

    parallel: ParallelConfig = Field(default_factory=ParallelConfig, description="Layout of the trainer's ranks.")
    critic_warmup_steps: int | None = Field(None, ge=0, description="Critic-only steps before the actor updates. None (the default): by the critic's start, 2 after critic_warm_load (T1 report, section 04) and 10 on a cold critic (the report: a cold start 'needs tens'; rl.trainer.settings.COLD_CRITIC_WARMUP_STEPS, docs/campaign.md 'Critic warm-up'). GRPO: none.")


class RolloutConfig(AgentLimits, Section):
    tasks_dir: str = Field("examples/tasks", description="Directory of Harbor-layout tasks (default: the repository's examples/tasks). " + RELATIVE_NOTE)
    batch_size: int = Field(8, ge=1, le=100_000, description="Trajectories per step.")
    n_samples_per_prompt: int = Field(2, ge=1, le=256, description="Samples per task (GRPO group size).")
    max_concurrency: int = Field(8, ge=1, description="Trials in flight at once.")
    sandbox_rate_per_s: float = Field(20.0, gt=0, description="Sandbox creations per second (token bucket).")
    skim_overprovision: float = Field(1.0, ge=1, le=4, description="Launch this multiple of the batch; accept the first to finish.")
    data_plane: Literal["object_store", "coordinator"] = Field("object_store", description="Where trajectories travel: 'object_store' (workers put them, the trainer fetches them, the coordinator carries refs; docs/scale.md) or 'coordinator' (the results carry them, the old path).")
    timeout_override_s: float | None = Field(None, gt=0, description="Global agent timeout; never lowers a task's own budget unless allow_lower_timeouts.")
    allow_lower_timeouts: bool = Field(False, description="Let timeout_override_s lower task-declared budgets (logged).")
    reward_scale: float = Field(20.0, gt=0, description="CTRF reward = passed tests / scale (report: S = 20).")
    num_workers: int = Field(1, ge=1, description="Rollout workers (one per node).")
    num_train_tasks: int | None = Field(None, ge=1, description="Train on a fixed, seeded subset of this many tasks (None: the whole pool).")
    failed_trials: Literal["drop", "zero", "abort"] = Field("zero", description="A trial that raised (sandbox or engine error): 'zero' (the default) = keep it as reward 0 with loss mask 0, so it still counts in its group's baseline and a fully_async group stays whole (SkyRL walkthrough, section 5); 'drop' it (counted in the ledger; a fully_async group short of a trial is dropped: the batch is then conditioned on sandbox success, and failures concentrate on the hardest tasks); 'abort' = the rollout fails, nothing is dropped (T1 report, section 05: dropping conditions the batch on success). A RoutingError always aborts.")
    truncated_reward_zero: bool = Field(False, description="A trial whose last turn hit max_new_tokens without a tool call (end_reason 'truncated') trains on reward 0 whatever the verifier said (walkthrough, section 5).")
    context_overflow_clear_mask: bool = Field(False, description="A trial that ran out of context (end_reason 'context_exhausted') trains with its whole loss mask cleared (walkthrough, section 5); its reward still counts in its GRPO group.")
    zero_variance_filter: bool = Field(False, description="sync / one_step pipelines: drop groups whose trained rewards are all equal (no GRPO signal), counted per step (fully_async uses fully_async.zero_variance_filter). Needs n_samples_per_prompt > 1.")
    debug_dump: bool = Field(False, description="Write each trajectory's TITO transitions (tito_transitions.json: every turn's relation, span and repair) and its stream with special tokens (tito_debug.txt) under RUN/debug/<sample_id>/ (the walkthrough's debug dump, section 5).")
    seed_requests: bool = Field(True, description="Seed each generation request from (run.seed, step, trial, call index) (SamplingParams.sampling_seed), so a trial samples the same tokens whichever engine serves it and whenever; false: the engine's own generator, in arrival order (docs/determinism.md).")
    agent: Literal["builtin", "command"] = Field("builtin", description="'builtin': t1ops's token-in agent loop; 'command': the [harness] program runs as the agent in the sandbox against the OpenAI endpoint (docs/harness.md).")


class RewardsConfig(Section):
    """What a trial trains on (T1 report, section 06); the verifier's reward is logged as is."""

    mode: Literal["dense", "binary"] = Field("dense", description="'dense': the verdict's reward (CTRF passed / S, fallbacks tagged); 'binary': 1 when the verdict says fully solved, else 0 (the report's binary-reward runs).")
    shape_length: Literal["none", "multiplicative", "additive_penalty", "efficiency_bonus"] = Field("none", description="Length shaping of the trained reward (T1 report, section 06; the production run used none): multiplicative discount with free zone and zero-pass branch, additive per-turn penalty, or efficiency bonus in same-test-count buckets.")
    free_turns: float = Field(25.0, gt=0, description="Free zone of the multiplicative discount (report: 25 turns).")
    power: float = Field(1.0, gt=0, description="Exponent of the multiplicative discount (free_turns / turns) ** power.")
    zero_pass_value: float = Field(-0.025, le=0, description="Multiplicative: what zero passes score in the free zone (report: half a test at S = 20).")
    penalty_per_turn: float = Field(0.0008, ge=0, description="Additive penalty per turn.")
    max_penalty: float = Field(0.04, ge=0, description="Cap of the additive penalty (report: below one test's worth, 1/20).")
    bonus: float = Field(0.025, ge=0, description="Efficiency bonus of the shortest full solve of a bucket.")


class HarnessConfig(Section):
    """The program ``rollout.agent = "command"`` runs as each trial's agent (docs/harness.md)."""

    argv: list[str] = Field(default_factory=lambda: ["{python}", "{harness}/openai_bash_agent.py"], min_length=1, description="Command line of the harness; {python}: an interpreter the sandbox uid can run, {harness}: program_dir as the trial sees it (nothing else of the repository exists in a trial).")
    program_dir: str = Field("examples/harness", description="Directory holding the harness program (default: the repository's examples/harness); read-only to the trial. " + RELATIVE_NOTE)
    max_corrections: int = Field(2, ge=0, le=10, description="Corrective observations per request when a reply's tool call does not parse; then the request fails.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the harness (no secrets: use the task's declared env).")


class McpServerConfig(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,32}$", description="Server name; its tools are offered as '<name>_<tool>'.")
    argv: list[str] = Field(min_length=1, description="Command line of the stdio server, started inside the trial's sandbox; placeholders as in harness.argv.")


class McpConfig(Section):
    """Tools from stdio MCP servers, offered to both agents (docs/harness.md)."""

    servers: list[McpServerConfig] = Field(default_factory=list, description="MCP servers started per trial inside its sandbox (empty: none).")


class EvalConfig(Section):
    """Held-out evaluation during training (docs/campaign.md, "Evaluation")."""

    every_steps: int = Field(0, ge=0, description="Evaluate held-out tasks every N RL steps, plus the warm-started weights (step 0) and the last step; 0: no evaluation.")
    tasks_dir: str | None = Field(None, description="A separate pool of evaluation tasks; None: the training pool's tasks left out of the training set (rollout.num_train_tasks). " + RELATIVE_NOTE)
    tasks: list[str] | None = Field(None, description="A declared evaluation split (task names in the eval pool); None: every held-out task. Never overlaps the training set (checked before launch).")
    samples_per_task: int = Field(2, ge=1, le=64, description="Trials per evaluation task.")
    greedy: bool = Field(False, description="Greedy decoding (temperature 0) for evaluation; false samples at eval.temperature.")
    temperature: float = Field(1.0, gt=0, le=4, description="Sampling temperature of evaluation trials when greedy = false.")
    timeout_s: float = Field(1800.0, gt=0, description="An evaluation still running this long after its submission is an error.")


class CheckpointsConfig(Section):
    """Checkpoint retention (docs/campaign.md, "Checkpoint retention"); how often: trainer.save_every."""

    keep_last: int | None = Field(4, ge=2, description="Keep the newest N steps of each role (None: keep all); the step a resume needs is always kept.")
    keep_every: int = Field(0, ge=0, description="Also keep every K-th step (0: none besides the last N).")


class GuardsConfig(Section):
    fd_warn_fraction: float = Field(0.8, gt=0, le=1, description="Warn when open fds exceed this fraction of the soft limit.")
    fd_sample_interval_s: float = Field(10.0, gt=0, le=3600, description="The fd guard samples every campaign process's open fds this often, on its own thread (and after every step).")
    stall_timeout_s: float = Field(300.0, gt=0, description="In-flight work with zero completions this long is an error.")
    host_ram_warn_fraction: float = Field(0.9, gt=0, le=1, description="Warn when projected host RAM exceeds this fraction.")
    nccl_timeout_min: float = Field(30.0, gt=0, description="NCCL group timeout (report: 30 min).")
    nccl_timeout_cp_min: float = Field(120.0, gt=0, description="NCCL timeout when context parallel > 1 (report: 120 min).")
    gloo_timeout_min: float = Field(60.0, gt=0, description="Gloo control-group timeout (report: 60 min).")
    watchdog_safety_factor: float = Field(3.0, ge=1, description="Hang bound = longest observed interval x this factor.")
    watchdog_first_step_bound_s: float = Field(7200.0, gt=0, description="Hang bound before any micro-batch interval is observed (report: cold compile took >30 min).")
    watchdog_min_bound_s: float = Field(60.0, gt=0, description="Floor of the learned hang bound, so fast steps do not make a hair trigger.")
    watchdog_warmup_ratio: float = Field(2.0, gt=1, description="A rank is warming up while its longest interval is this many times its latest (report: 489 s -> 22 s).")
    watchdog_straggler_factor: float = Field(2.0, gt=1, description="A rank is a straggler when its recent interval exceeds the peers' median by this factor.")
    nccl_heartbeat_timeout_s: float = Field(600.0, gt=0, description="TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC set in every process (watchdog-thread liveness, not the collective timeout).")
    collective_slow_fraction: float = Field(0.5, gt=0, lt=1, description="Report a collective as slow (not dead) after this fraction of its timeout.")
    adam_host_bytes_per_param: float = Field(12.0, gt=0, description="Host bytes per parameter of CPU-offloaded fp32 Adam (fp32 master + exp_avg + exp_avg_sq).")
    sandbox_host_gib: float = Field(2.0, ge=0, description="Host RAM one concurrent sandbox worker costs, for the host-memory projection.")
    field: FieldGuardsConfig = Field(default_factory=FieldGuardsConfig, description="Guards for failures reported from the field: slow verifiers, host RAM leaks, group-init races (t1ops/guards/field_config.py).")
    health: RunHealthConfig = Field(default_factory=RunHealthConfig, description="Run-health alarms' thresholds: a phase stalled, aborts, groups without reward spread, truncation, K/V cache, explained variance, log-prob gap, retokenized share, shrinking evaluations (t1ops/guards/run_health.py).")


class FullyAsyncConfig(Section):
    """run.mode = "fully_async" (SkyRL walkthrough, section 8; docs/async.md). Units are prompt groups."""

    num_parallel_generation_workers: int = Field(8, ge=1, le=100_000, description="Prompt groups generating at once (the walkthrough's 64 group workers).")
    max_staleness_steps: int = Field(1, ge=0, le=1000, description="Capacity rule: accepted + running groups <= (max_staleness_steps + step) x groups per step. A budget, not an SLA: older groups are accepted and counted as violations.")
    zero_variance_filter: bool = Field(True, description="Drop groups whose rewards are all equal (no GRPO signal); counted per step.")
    sample_full_batch: bool = Field(True, description="Keep drawing groups until a step has rollout.batch_size / n_samples_per_prompt useful ones (False: train on what the first groups give).")
    staleness_alarm_share: float = Field(0.25, ge=0, le=1, description="Alarm (error event, step line) when more than this share of a step's groups exceed max_staleness_steps.")
    max_draws_factor: int = Field(8, ge=1, le=1000, description="A step that drops more than this many times its group count (all zero variance) stops with an error naming the fix.")


class SandboxConfig(Section):
    """How trials are isolated (docs/sandbox.md). A task's own ``[environment]`` memory_mb /
    cpus / storage_mb replace the limits below for its trials."""

    isolation: Literal["strict", "namespaces", "none"] = Field("strict", description="Weakest isolation `t1ops run` accepts: strict = per-trial uid + namespaces + cgroup; namespaces = the same with per-process rlimits; none = host user (non-root only).")
    allow_internet: bool = Field(False, description="Give the network to tasks that declare allow_internet (otherwise every trial has no network). Such a trial needs an egress-only network namespace; where none can be made it is refused (docs/sandbox.md).")
    env_allow: list[str] = Field(default_factory=list, description="Campaign environment variables a task's [environment.env] ${VAR} templates may read (any other name reads as unset); values read are redacted like secrets.")
    memory_mb: int = Field(1024, ge=16, description="Memory of one trial, all its processes and its tmpfs together (cgroup; rlimit fallback per process).")
    cpus: float | None = Field(None, gt=0, description="CPU quota of one trial in cores (cgroup cpu.cfs_quota_us); None: no quota.")
    storage_mb: int = Field(256, ge=1, description="Size of the trial's tmpfs: workspace, /tmp, /var/tmp, /dev/shm together.")
    num_files: int = Field(20_000, ge=64, description="Inodes of the trial's tmpfs (files + dirs).")
    num_procs: int = Field(64, ge=4, description="Processes of one trial (cgroup pids.max and RLIMIT_NPROC).")
    cpu_s: int = Field(30, ge=1, description="CPU seconds per process (RLIMIT_CPU).")


class EnvironmentConfig(Section):
    """Where a trial's commands run (docs/containers.md)."""

    backend: Literal["local", "container"] = Field("local", description="'local': namespaces on this host, the task's Dockerfile honoured where the host's userland can (docs/sandbox.md); 'container': each task's Dockerfile built into an image and every trial run in its own container (rootful podman + runc; scripts/setup-container-runtime.sh).")


class TelemetryConfig(Section):
    otlp_endpoint: str | None = Field(None, description="OTLP/HTTP endpoint; None writes JSON lines only.")
    export_interval_s: float = Field(5.0, gt=0, description="Metric export interval.")


class TrackingConfig(Section):
    """Experiment trackers fed every step row, eval, guard event and the final report (docs/tracking.md).
    summary.json and telemetry/*.jsonl stay the source of truth: a tracker that fails is turned off."""

    tensorboard: bool = Field(True, description="Write TensorBoard event files into the run directory (`tensorboard --logdir runs/<id>`); no network.")
    wandb: Literal["off", "offline", "online"] = Field("off", description="Weights & Biases: 'offline' writes run_dir/wandb/ (upload later with `wandb sync`), 'online' streams (needs `wandb login`).")
    project: str = Field("t1ops", min_length=1, description="W&B project.")
    entity: str | None = Field(None, description="W&B entity (team or user); None: the logged-in default.")
    run_name: str | None = Field(None, description="W&B run display name; None: the run id.")
    tags: list[str] = Field(default_factory=list, description="W&B run tags.")


class CampaignConfig(Section):
    """The root of a campaign file. Fields that depend on each other are checked together."""

    FILE_KIND: ClassVar[FileKind] = FileKind("campaign config", "t1ops config", "examples/tiny/campaign.toml",
                                              "t1ops run")

    run: RunConfig = Field(default_factory=RunConfig, description="Run identity and length.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Model shape.")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="Inference engines.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Learning.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Agent rollouts.")
    rewards: RewardsConfig = Field(default_factory=RewardsConfig, description="The trained reward (mode, length shaping).")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    checkpoints: CheckpointsConfig = Field(default_factory=CheckpointsConfig, description="Checkpoint retention.")
    guards: GuardsConfig = Field(default_factory=GuardsConfig, description="Guardrail thresholds.")
    harness: HarnessConfig = Field(default_factory=HarnessConfig, description="The command agent (rollout.agent = 'command').")
    mcp: McpConfig = Field(default_factory=McpConfig, description="MCP tool servers for both agents.")
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig, description="OpenTelemetry export.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="TensorBoard and Weights & Biases.")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Trial isolation and limits.")
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig, description="Environment backend of the trials (local or container).")
    fully_async: FullyAsyncConfig = Field(default_factory=FullyAsyncConfig, description="Fully async pipeline (run.mode = 'fully_async').")

    @property
    def pipeline_mode(self) -> str:
        """run.mode (one key: the former run.one_step_pipeline switch is RENAMED_KEYS')."""
        return self.run.mode

    @model_validator(mode="after")
    def _consistent(self) -> CampaignConfig:
        r, m = self.rollout, self.model
        if self.pipeline_mode == "fully_async" and self.trainer.tis_mode != "off":
            raise ValueError(f"trainer.tis_mode = '{self.trainer.tis_mode}' is not applied under run.mode = "
                             "'fully_async': the rollout log-probs are the behaviour there, so the ratio already "
                             "holds the correction and TIS is recorded only; set trainer.tis_mode = 'off' "
                             "(docs/async.md)")
        if self.trainer.critic_warm_load and (self.trainer.mode != "ppo" or self.trainer.parallel.world_size > 1):
            raise ValueError("trainer.critic_warm_load needs trainer.mode = 'ppo' (GRPO has no critic) on a "
                             "single-rank trainer (the multi-rank trainer does not load it yet)")
        if r.zero_variance_filter and (r.n_samples_per_prompt < 2 or self.pipeline_mode == "fully_async"):
            raise ValueError("rollout.zero_variance_filter needs groups (n_samples_per_prompt > 1) and the sync "
                             "or one_step pipeline; under fully_async set fully_async.zero_variance_filter")
        if r.batch_size % r.n_samples_per_prompt:
            raise ValueError(f"rollout.batch_size ({r.batch_size}) must be a multiple of "
                             f"rollout.n_samples_per_prompt ({r.n_samples_per_prompt}): a partial group would "
                             "silently shrink every batch")
        groups, minis = r.batch_size // r.n_samples_per_prompt, self.trainer.mini_batches
        if minis > groups:
            raise ValueError(f"trainer.mini_batches ({minis}) splits a step's {groups} prompt groups "
                             "(rollout.batch_size / n_samples_per_prompt) into optimizer steps, each at least "
                             "one group: lower it or raise rollout.batch_size")
        if r.summary_max_new_tokens and r.summary_max_new_tokens + r.max_new_tokens >= r.context_window:
            raise ValueError(f"rollout.summary_max_new_tokens ({r.summary_max_new_tokens}) + max_new_tokens "
                             f"({r.max_new_tokens}) must be below rollout.context_window ({r.context_window}): "
                             "the loop keeps room for one more turn and the summary request; lower it (the "
                             "report: 8,192 of 86,016) or set 0 to turn compaction off")
        if r.context_window > m.max_seq_len:
            raise ValueError(f"rollout.context_window ({r.context_window}) exceeds model.max_seq_len "
                             f"({m.max_seq_len}): the engine would refuse long prompts")
        if m.num_attention_heads % m.num_query_groups:
            raise ValueError(f"model.num_attention_heads ({m.num_attention_heads}) must be a multiple of "
                             f"model.num_query_groups ({m.num_query_groups}) (grouped-query attention)")
        if self.engine.kind == "sglang" and self.engine.compact_vocab:
            raise ValueError("engine.kind = 'sglang' serves the tokenizer's full vocabulary: set "
                             "engine.compact_vocab = false (the compact vocabulary is the embedded tiny model's option)")
        if self.engine.kind == "sglang" and len(self.engine.urls) != self.engine.num_engines:
            raise ValueError(f"engine.kind = 'sglang' needs one URL per engine: {len(self.engine.urls)} urls "
                             f"for engine.num_engines = {self.engine.num_engines}")
        p = self.trainer.parallel
        errors = trainer_errors(dp=p.dp, tp=p.tp, pp=p.pp, ep=p.ep, sequence_parallel=p.sequence_parallel,
                                num_layers=m.num_layers, num_experts=m.num_experts,
                                num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups,
                                cp=p.cp)
        if errors:
            raise ValueError("trainer.parallel: " + "; ".join(errors))
        return self


# Keys that were renamed or moved: old dotted key -> new dotted key. An old key in a file or a
# --set is an error naming the new one (never silently ignored, never silently mapped).
RENAMED_KEYS: dict[str, str] = {
    "run.one_step_pipeline": 'run.mode ("one_step" for true, "sync" for false)',
}


def parse_config(data: dict[str, Any], model: type[BaseModel] = CampaignConfig, source: str = "<dict>") -> Any:
    """Validate ``data`` into ``model``; raise ConfigError naming each bad key
    (``t1ops.config_errors``: did you mean, the schema command, the kind of file expected).

    Strict types: outside data is never coerced (``"8"``, ``true`` or ``8.0``
    for an integer are errors, not 8 / 1 / 8); an integer is a valid float.
    """
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as err:
        raise ConfigError(explain(err, source, model, data, RENAMED_KEYS, root_models()), source=source) from None


def root_models() -> list[type[BaseModel]]:
    """The root model of every kind of config file (imported here: they import this module)."""
    from t1ops.plan.inputs import SimConfig
    from t1ops.preflight.plan import Plan

    return [CampaignConfig, Plan, SimConfig]


@dataclass
class LoadedConfig:
    """A validated config file and where each value came from (``t1ops run --dry-run``)."""

    config: Any
    path: Path
    sources: dict[str, str]                      # dotted key -> "default", "file" or "--set"
    paths: dict[str, ResolvedPath] = dc_field(default_factory=dict)  # input paths, resolved

    def missing_files(self) -> list[str]:
        """The input paths that name no file or directory (``t1ops.config_paths.check_files``)."""
        return check_files(self.config, self.paths) if isinstance(self.config, CampaignConfig) else []


def load_config(path: str | Path, model: type[BaseModel] = CampaignConfig,
                overrides: list[tuple[str, Any]] | None = None) -> LoadedConfig:
    """Load a TOML file into ``model`` with ``overrides`` ((dotted key, value) pairs, ``--set``)
    set into its data before validation, so they are validated exactly like the file. A campaign's
    relative input paths resolve against the file's directory (``t1ops.config_paths``)."""
    from t1ops.overrides import apply_overrides, dotted

    path = Path(path)
    try:
        text = path.read_text()
        deep = check_nesting(text)   # tomllib recurses per level: a deep file is a RecursionError (#51)
        if deep:
            raise ConfigError(f"config file {path} {deep}; a campaign config nests a few levels", path=str(path))
        data = tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist (resolved to {path.absolute()})",
                          path=str(path)) from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory; give a {_kind_name(model)} file (TOML)", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {path} cannot be read as UTF-8 text: {err}", path=str(path)) from None
    except (tomllib.TOMLDecodeError, RecursionError) as err:
        raise ConfigError(f"config file {path} is not valid TOML: {short(err, 300)}", path=str(path)) from None
    file_keys = set(dotted(data))
    set_keys = {k for k, _ in overrides or []}
    source = str(path)
    if overrides:
        data = apply_overrides(data, overrides)
        source = f"{path} with --set " + " ".join(k for k, _ in overrides)
    paths = {}
    if issubclass(model, CampaignConfig):
        paths = resolve(data, file_dir=path.resolve().parent, set_keys=set_keys,
                        defaults=dotted(CampaignConfig().model_dump()))
    cfg = parse_config(data, model, source=source)
    sources = {k: "--set" if k in set_keys else "file" if k in file_keys else "default"
               for k in dotted(cfg.model_dump())}
    return LoadedConfig(cfg, path, sources, paths)


def load_toml(path: str | Path, model: type[BaseModel] = CampaignConfig,
              overrides: list[tuple[str, Any]] | None = None) -> Any:
    """The validated config of :func:`load_config` (CampaignConfig unless told otherwise)."""
    return load_config(path, model, overrides).config


def _kind_name(model: type[BaseModel]) -> str:
    kind = getattr(model, "FILE_KIND", None)
    return kind.name if kind else "config"


def describe(model: type[BaseModel] = CampaignConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, description) for every field, for `t1ops config`."""
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, Section):
            rows.extend(describe(ann, prefix=f"{key}."))
        else:
            default = field.get_default(call_default_factory=True)
            rows.append((key, repr(default), field.description or ""))
    return rows
