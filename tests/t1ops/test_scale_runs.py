"""bench/scale_runs.py: every validation run is the fitted run's config and task pool, only the mode
(or the batch) differs, so what the simulator takes from the fit (the zero-variance share) applies."""
from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scale_runs.py"


def _config():
    spec = importlib.util.spec_from_file_location("scale_runs", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.config


def test_every_run_shares_the_fitted_runs_pool_and_differs_only_in_mode_or_batch():
    config = _config()
    fit = config("one_step", 5)
    for name, mode in (("sync", "sync"), ("fully_async", "fully_async"), ("fully_async_nofilter", "fully_async"),
                       ("one_step_2x", "one_step")):
        cfg = config(name, 5)
        assert cfg.run.mode == mode and cfg.rollout.tasks_dir == fit.rollout.tasks_dir
        assert cfg.trainer.model_dump() == fit.trainer.model_dump()
    assert config("one_step_2x", 5).rollout.batch_size == 2 * fit.rollout.batch_size
    fa = config("fully_async", 5).fully_async
    assert fa.zero_variance_filter and fa.num_parallel_generation_workers == 8 and fa.max_staleness_steps == 1
    off = config("fully_async_nofilter", 5).fully_async
    assert not off.zero_variance_filter and off.model_dump() == {**fa.model_dump(), "zero_variance_filter": False}
