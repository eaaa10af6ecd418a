"""The TensorBoard sink: event files in the run directory, through torch's ``SummaryWriter``.

Scalars per step; guard events as a text panel (``guards/events``) at their step; the config as
hyperparameters (HPARAMS tab) and as a text panel; ``report.png`` as an image, refreshed during the run (the IMAGES tab's step slider).
A resumed run opens its writer with ``purge_step`` = the first step it runs again: TensorBoard then
drops what the crashed run wrote from that step on, so no step has two points.
"""
from __future__ import annotations

import json
from pathlib import Path

FLUSH_S = 5  # a crash loses at most this much of what was not flushed at a step's end


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, log_dir: Path, purge_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step, flush_secs=FLUSH_S)

    def hparams(self, config: dict, flat: dict, metric_tags: list[str]) -> None:
        from torch.utils.tensorboard.summary import hparams

        for summary in hparams(flat, {tag: 0.0 for tag in metric_tags}):
            self.writer.file_writer.add_summary(summary)
        self.writer.add_text("config", "```json\n" + json.dumps(config, indent=1, default=str) + "\n```", 0)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def text(self, step: int, tag: str, markdown: str) -> None:
        self.writer.add_text(tag, markdown, step)

    def image(self, step: int, tag: str, path: Path) -> None:
        import matplotlib.image

        pixels = matplotlib.image.imread(str(path))  # float RGBA in [0, 1] for a PNG
        self.writer.add_image(tag, pixels[..., :3], step, dataformats="HWC")

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
