"""The campaign: one Ray application running engines, rollout workers and the trainer."""
