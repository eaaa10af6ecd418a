"""Experiment trackers (TensorBoard, Weights & Biases) fed by the summary's row writer (docs/tracking.md)."""
from t1ops.tracking.tracker import Tracker, TrackerWarning

__all__ = ["Tracker", "TrackerWarning"]
