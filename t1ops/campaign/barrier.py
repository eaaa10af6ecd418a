"""The weight sync as one transaction, owned by the coordinator (docs/weights.md, "One transaction").

    with engine_barrier(router, version, checkpoint_dir) as barrier:
        barrier.push_from(trainer)
    report = barrier.report

Opening closes the router's gate and pauses the engines (no token is sampled while weights load)
and names the targets; the trainer pushes to exactly those (:mod:`t1ops.campaign.weight_push`);
the router checks what each engine loaded and may name some again (a checksum mismatch); closing
rotates, resumes, proves every engine resumed and reopens the gate. A push that raises aborts the
barrier with the gate closed and the error goes on up: no engine serves half-synced weights. The
router never calls the trainer. Versions are the trainer's integer steps; the engines' SGLang
``weight_version`` string is their wire form (``str(version)``).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

# The failure ids of docs/failures.md this guard catches (`t1ops explain ID`): a resume pushes the
# checkpoint's weights through this barrier before the step loop asks for any rollout, and a request
# that meets a closed gate waits engine.generate_timeout_s at most.
CATCHES = {
    "resume-deadlock": ("engine.generate_timeout_s",),
}


class OpenBarrier:
    """One open barrier on the router: its targets, and the report once closed."""

    def __init__(self, router, version: int, targets: list[tuple[int, str]]) -> None:
        self.router, self.version, self.targets = router, version, targets
        self.report: dict | None = None
        self.num_pushes = 0

    def push_from(self, trainer) -> None:
        """The trainer pushes to the targets, again while the router names engines to re-push to."""
        import ray

        while self.targets:
            result = ray.get(trainer.push_weights.remote(self.version, self.targets))
            self.num_pushes += 1
            self.targets = ray.get(self.router.pushed.remote(result))


@contextmanager
def engine_barrier(router, version: int, checkpoint_dir: str | None) -> Iterator[OpenBarrier]:
    """Open the router's barrier for ``version``; close it when the block ends (module docstring).
    ``checkpoint_dir``: the trainer's newest actor checkpoint, where recreated engines start from."""
    import ray

    barrier = OpenBarrier(router, version, ray.get(router.open_sync.remote(checkpoint_dir, version)))
    try:
        yield barrier
    except BaseException as exc:
        ray.get(router.abort_sync.remote(f"{type(exc).__name__}: {exc}"))
        raise
    barrier.report = ray.get(router.close_sync.remote())
