"""Agent-side pieces: Harbor tasks, the local sandbox, the CTRF verifier, safe archives.

API for the agent loop and the campaign::

    task = load_task("examples/tasks/text-sort")       # or load_pool("examples/tasks")
    sandbox = Sandbox(root, run_id)                     # probes uid drop / namespaces / cgroup once
    trial = sandbox.create(task, trial_idx=0)           # <root>/<run_id>/<task>-<idx>-<uuid8>/
    # each command: fresh namespaces, per-trial uid, workspace at /app (docs/sandbox.md)
    r = trial.exec("sort in.txt > out.txt", timeout_s=10)
    # r: ExecResult(stdout, stderr, exit_code, reason, duration_s, truncated); reason is ok |
    # exit_nonzero | timeout | budget_exhausted | cpu_limit | memory_limit | process_limit |
    # file_size_limit | open_files_limit | disk_limit (r.limit_hit for the limit ones)
    v = verify(trial)                                   # once per trial, after the agent is done
    # v: VerifierResult(trial_id, run_tag, reward: RewardResult, tamper_events, exit_code, reason, ...)
    trial.close()                                       # unmounts the trial's tmpfs, drops its cgroup

Secrets a task declares (``environment.required_env_keys``) reach the commands and are
redacted (with their encoded forms) from ExecResult and the trial's logs; use ``rl.agent.secrets.redact`` for anything else that leaves a trial.
"""
