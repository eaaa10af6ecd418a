"""Agent-side pieces: Harbor tasks, the local sandbox, the CTRF verifier, safe archives.

API for the agent loop::

    task = load_task("examples/tasks/text-sort")
    sandbox = Sandbox(root, run_id)
    trial = sandbox.create(task, trial_idx=0)
    result = trial.exec("sort in.txt > out.txt", timeout_s=10)   # ExecResult(stdout, stderr, exit_code, reason)
    verdict = verify(trial)            # VerifierResult(reward: RewardResult, tamper_events, ...)
"""
