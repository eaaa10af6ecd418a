"""The base of every config section (``t1ops.config`` and the sub-models that live beside the
guards that own them): unknown keys are errors, values validated."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, values validated."""

    # allow_inf_nan=False: an inf timeout or size would silently disable its guard; None means "no limit"
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)
