"""A healthy `t1ops run` starts quietly and on its own Ray cluster (docs/campaign.md, "Ray's lifetime")."""
from __future__ import annotations

import logging

import pytest

from t1ops.campaign import launch
from t1ops.config import CampaignConfig


def test_only_rays_token_auth_notice_is_dropped(caplog) -> None:
    launch._quiet_auth_notice()
    launch._quiet_auth_notice()  # idempotent: one filter
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    assert sum(isinstance(f, launch._DropAuthNotice) for f in logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logger.warning("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out.")
        logger.warning("Token authentication is disabled for this Ray cluster. Anyone with network access ...")
    assert [r.getMessage()[:40] for r in caplog.records] == ["Token authentication is disabled for thi"]


@pytest.mark.parametrize("address, env, expected", [
    (None, None, "local"),                       # never a cluster another process left behind
    (None, "10.0.0.1:6379", None),               # RAY_ADDRESS chosen by the user: Ray reads it
    ("10.0.0.2:6379", None, "10.0.0.2:6379"),
])
def test_a_campaign_starts_its_own_cluster_unless_told_otherwise(monkeypatch, address, env, expected) -> None:
    import ray

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    cfg = CampaignConfig.model_validate({"run": {"ray_address": address}})
    launch._init_ray(cfg)
    assert seen["address"] == expected
