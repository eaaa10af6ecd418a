"""Plan schema, structural checks, report shape and the CLI of `t1ops preflight`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t1ops.cli import main
from t1ops.errors import ConfigError, PreflightRefusal
from t1ops.preflight import check_plan, load_plan
from t1ops.preflight.memory import binding_tokens_per_gpu, estimate, phases, stage_memory
from t1ops.preflight.plan import Plan

PLANS = Path(__file__).resolve().parents[2] / "examples" / "plans"
SHIPPED = sorted(PLANS.glob("*.toml"))


def plan(name: str) -> Plan:
    return load_plan(PLANS / f"qwen35-122b-{name}.toml")


def with_(p: Plan, section: str, **update) -> Plan:
    return p.model_copy(update={section: getattr(p, section).model_copy(update=update)})


def ids(report) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in report.findings:
        out.setdefault(f.severity, set()).add(f.id)
    return out


def test_the_four_plans_ship_and_parse():
    assert [p.name for p in SHIPPED] == ["qwen35-122b-128gpu-cp2.toml", "qwen35-122b-128gpu-cp4.toml",
                                         "qwen35-122b-56gpu.toml", "qwen35-122b-dp1.toml"]
    for path in SHIPPED:
        assert load_plan(path).model.num_layers == 48


def test_unknown_key_and_bad_layout_are_config_errors(tmp_path):
    text = (PLANS / "qwen35-122b-128gpu-cp4.toml").read_text()
    (tmp_path / "typo.toml").write_text(text.replace("cp = 4", "cp = 4\ncontext_parallel = 4"))
    with pytest.raises(ConfigError, match="context_parallel"):
        load_plan(tmp_path / "typo.toml")
    (tmp_path / "bad.toml").write_text(text.replace("cp = 4", "cp = 3"))
    with pytest.raises(ConfigError, match="not divisible by tp\\*pp\\*cp"):
        load_plan(tmp_path / "bad.toml")
    (tmp_path / "dp.toml").write_text(text.replace("cp = 4", "cp = 4\ndp = 1"))
    with pytest.raises(ConfigError, match="dp is derived"):
        load_plan(tmp_path / "dp.toml")


@settings(max_examples=10, deadline=None)
@given(gpus=st.sampled_from([64, 128, 256, 512]), stage=st.sampled_from([0, 1]))
def test_expert_optimizer_bytes_depend_only_on_train_gpus(gpus, stage):
    p = with_(plan("128gpu-cp4"), "parallelism", train_gpus=gpus)
    ph = phases(p)[0]
    by_ep = {ep: stage_memory(p, ph, stage, ep).terms for ep in (2, 4, 8, 16, 32)}
    optimizer = {t["optimizer"] for t in by_ep.values()}
    assert max(optimizer) - min(optimizer) <= 16  # EP cancels, up to integer rounding
    weights = [by_ep[ep]["weights"] for ep in sorted(by_ep)]
    assert weights == sorted(weights, reverse=True)  # ...while lowering EP only adds weight bytes
    more = with_(p, "parallelism", train_gpus=2 * gpus)
    assert stage_memory(more, ph, stage, 16).terms["optimizer"] < by_ep[16]["optimizer"]


def test_lowering_ep_warns_with_doubling_and_tp4_warns():
    report = check_plan(with_(plan("128gpu-cp4"), "parallelism", ep=8))
    msg = next(f.message for f in report.findings if f.severity == "warning" and f.id == "expert-parallel-identity")
    assert "ep = 8 is below the maximal 32" in msg and "(4x)" in msg
    report = check_plan(with_(plan("128gpu-cp4"), "parallelism", tp=4, cp=2))
    tp = next(f for f in report.findings if f.id == "tensor-parallel")
    assert tp.severity == "warning" and "3.19B GatedDeltaNet" in tp.message and "KV-replication" in tp.message


def test_dp1_refused_with_the_arithmetic():
    report = check_plan(plan("dp1"))
    f = next(f for f in report.findings if f.id == "dp1-incompatible")
    assert f.severity == "error" and report.verdict == "refuse"
    assert "ep <= tp*cp*dp/etp = 2" in f.message and "256 / 2 = 128 experts per layer" in f.message
    # the same layout with dp > 1 (cp = 2 -> dp = 1 still, so give it more GPUs) is not a DP = 1 error
    ok = with_(plan("dp1"), "parallelism", train_gpus=64, dp=None)
    assert "dp1-incompatible" not in {x.id for x in check_plan(ok).findings}


def test_max_tokens_cannot_fix_indivisible_sample_and_points_at_cp():
    p = plan("128gpu-cp2")
    lowered = with_(p, "batch", max_tokens_per_gpu=4096)
    assert binding_tokens_per_gpu(lowered) == binding_tokens_per_gpu(p) == 43_008
    assert estimate(lowered).binding.peak_bytes == estimate(p).binding.peak_bytes
    f = next(f for f in check_plan(lowered).findings if f.id == "max-tokens-per-gpu")
    assert f.severity == "error" and "indivisible" in f.message and "Raise cp to 4" in f.message


def test_no_max_tokens_finding_when_plan_fits():
    assert "max-tokens-per-gpu" not in {f.id for f in check_plan(plan("128gpu-cp4")).findings}


def test_cp_without_native_gdn_cp_is_an_error():
    report = check_plan(with_(plan("128gpu-cp4"), "precision", gdn_native_cp=False))
    assert "gdn-cp" in ids(report)["error"]


def test_host_ram_refuses_the_reports_os_oom_kill_layout():
    p = with_(with_(plan("128gpu-cp4"), "precision", optimizer_offload_fraction=1.0),
              "hardware", sandbox_workers_per_train_node=260)
    report = check_plan(p)
    f = next(f for f in report.findings if f.id == "host-ram")
    assert f.severity == "error" and "dmesg" in f.message
    assert report.memory.fits  # the GPUs are fine: the host is what dies


def test_report_json_shape_and_raise_if_refused():
    d = check_plan(plan("128gpu-cp2"), name="cp2").to_dict()
    assert d["verdict"] == "refuse"
    assert set(d["findings"][0]) == {"id", "severity", "message"}
    assert set(d["memory"]) >= {"peak_gib", "fits", "terms_gib"}
    assert d["memory"]["terms_gib"]["logits_buffer"] == pytest.approx(29.84, abs=0.01)
    with pytest.raises(PreflightRefusal, match="cp2") as err:
        check_plan(plan("128gpu-cp2"), name="cp2").raise_if_refused()
    assert "memory" in err.value.context["finding_ids"]
    check_plan(plan("128gpu-cp4")).raise_if_refused()


def test_cli_json_and_exit_codes(capsys):
    assert main(["preflight", str(PLANS / "qwen35-122b-128gpu-cp4.toml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "ok" and out["memory"]["fits"] is True
    assert main(["preflight", str(PLANS / "qwen35-122b-dp1.toml")]) == 1
    assert "dp1-incompatible" in capsys.readouterr().out


def test_require_ok_gate_for_launchers(tmp_path):
    from t1ops.preflight import require_ok

    assert require_ok(PLANS / "qwen35-122b-128gpu-cp4.toml").verdict == "ok"
    with pytest.raises(PreflightRefusal, match="dp1-incompatible"):
        require_ok(PLANS / "qwen35-122b-dp1.toml")
    with pytest.raises(PreflightRefusal):
        require_ok(plan("56gpu"))


@pytest.mark.parametrize("path", sorted(Path("examples/plans").glob("*.toml")), ids=lambda p: p.stem)
def test_preflight_names_whether_the_trainer_runs_the_layout(path):
    """Each plan's report says whether t1ops' rank trainer runs its layout, by the trainer's own rules:
    the shipped plans pipeline (pp > 1) and the trainer runs them, pp and cp included; the dp = 1 plan's
    expert layout is one no trainer can build, and the finding names why."""
    plan = load_plan(path)
    par = plan.parallelism
    f = next(f for f in check_plan(plan).findings if f.id == "trainer-layout")
    assert par.pp > 1 and f"pp = {par.pp}, cp = {par.cp}," in f.message
    if path.stem == "qwen35-122b-dp1":
        assert f.message.startswith("t1ops' rank trainer does not run this layout") and "ep = 16 needs" in f.message
    else:
        assert f.message.startswith("t1ops' rank trainer runs this layout"), f.message
