"""The Weights & Biases sink, through the ``wandb`` library.

``offline`` writes ``run_dir/wandb/offline-run-*/run-<id>.wandb`` with no network (upload later
with ``wandb sync run_dir/wandb/offline-run-*``); ``online`` streams to the server ``wandb login``
set up. The run id is chosen once and kept in the run directory (``tracking.json``): a resumed
campaign opens the same W&B run (``resume="allow"``), and its history continues at the first step it
runs again (W&B's own ``_step`` is the campaign step). The config is the run's config; guard events
are a text column ``guards/events`` at their step, and in online mode also W&B alerts.
"""
from __future__ import annotations

from pathlib import Path


def new_run_id() -> str:
    """A W&B run id (8 of [a-z0-9], as W&B's own), chosen once per campaign."""
    import secrets
    import string

    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class WandbSink:
    name = "wandb"

    def __init__(self, mode: str, run_dir: Path, run_id: str, *, project: str, entity: str | None,
                 name: str, tags: list[str], config: dict) -> None:
        import wandb

        self.online = mode == "online"
        settings = wandb.Settings(console="off", silent=True, disable_git=True, save_code=False,
                                  x_disable_stats=True, x_disable_machine_info=True)
        self.run = wandb.init(mode=mode, project=project, entity=entity, name=name, tags=tags or None,
                              id=run_id, resume="allow", dir=str(run_dir), config=config, settings=settings)

    def hparams(self, config: dict, flat: dict, metric_tags: list[str]) -> None:
        """The config went to ``wandb.init``; nothing more to write."""

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def text(self, step: int, tag: str, markdown: str) -> None:
        self.run.log({tag: markdown}, step=step)
        if self.online and "**error**" in markdown:
            import wandb

            self.run.alert(title=f"t1ops guard event at step {step}", text=markdown, level=wandb.AlertLevel.ERROR)

    def image(self, step: int, tag: str, path: Path) -> None:
        import wandb

        self.run.log({tag: wandb.Image(str(path))}, step=step)

    def flush(self) -> None:
        """W&B writes each ``log`` through its own service process."""

    def close(self) -> None:
        self.run.finish()
