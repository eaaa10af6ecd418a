"""Shared pytest fixtures."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_root() -> Path:
    return REPO


# Property tests are reproducible in the suite (the same examples every run, so a green main stays
# green); explore new inputs with `pytest --hypothesis-profile=explore` (random, more examples).
from hypothesis import settings as _hyp_settings  # noqa: E402

_hyp_settings.register_profile("repro", derandomize=True, print_blob=True)
_hyp_settings.register_profile("explore", derandomize=False, max_examples=1000, print_blob=True)
_hyp_settings.load_profile("repro")

# tests/fixtures/ holds task directories whose tests are run by the sandbox's verifier,
# never by this suite
collect_ignore_glob = ["fixtures/*"]


@pytest.fixture(autouse=True)
def _no_ray_left_running():
    """Fail the test that leaves Ray initialised: a cluster started by a stray thread dies with that
    thread and takes the whole pytest process down a minute later, tests away (docs/campaign.md)."""
    yield
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail("the test left Ray initialised (a campaign not shut down, or a Ray call after "
                    "ray.shutdown() that auto-started a cluster)")


@pytest.fixture(autouse=True)
def _fresh_event_ring():
    """Each test sees only the events it caused: the in-process ring outlives tests, and an earlier
    test's event would satisfy a later test's ``recent_events(...)[-1]`` check."""
    from t1ops import telemetry

    telemetry.forget_recent_events()
    yield


# --- no silent skips in CI ------------------------------------------------------------------------
# CI (`CI=true`, as .ci/run runs) installs everything the suite needs, so a skipped test there is
# a check that never ran: it fails instead, unless its reason names what CI's machine cannot have
# (a GPU: CUDA, NCCL). Locally a skip stays a skip, with its reason saying what to install.
_GPU_ONLY = re.compile(r"\b(gpu|cuda|nccl)\b", re.IGNORECASE)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    text = str(longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr)
    return text.removeprefix("Skipped: ")


def _fail_ci_skip(report) -> None:
    reason = _skip_reason(report)
    if _GPU_ONLY.search(reason):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped in CI ({reason}); CI installs what the suite needs (.ci/run), so only a "
                       "skip whose reason names a GPU (gpu, cuda, nccl) is allowed there")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        _fail_ci_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if _in_ci() and report.skipped:  # a module skipped as a whole at import
        _fail_ci_skip(report)


# --- parallel runs (pytest-xdist, `-n 3 --dist loadgroup` in pyproject.toml) ----------------------
# Tests that read one session fixture (a shared campaign: tests/t1ops/conftest.py) run on one
# worker, so it runs once. Otherwise a fast test stays with the other tests of its module on one
# worker, so a module-scoped fixture (an engine process, a built model) is set up once, not once
# per worker; a slow or chaos test (a real campaign, mostly waiting on sandboxes) is scheduled on
# its own, so two of them overlap. Nothing they share collides across worker processes: each
# campaign starts its own local Ray (t1ops/campaign/launch.py), trial uids are drawn from a 10^9
# range, trial directories and cgroups carry a random suffix, each worker has its own tmp_path root.
def _shared_session_fixture(item) -> str | None:
    info = getattr(item, "_fixtureinfo", None)
    for name in sorted(getattr(item, "fixturenames", ())):
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs and defs[-1].scope == "session" and defs[-1].baseid:  # ours, not pytest's own
            return name
    return None


def _is_long(item) -> bool:
    return item.get_closest_marker("slow") is not None or item.get_closest_marker("chaos") is not None


# The heaviest long tests, heaviest first (each 1.5-3 min on the 2-core CI host, docs/testing.md "Where
# the time goes"): handed out first so that none of them starts last and runs alone. A test missing
# here only starts later among the long ones; nothing else depends on this list.
HEAVIEST = ("test_verify_recovery.py::test_every_fault", "[coordinator-crash]", "[long-tail-stall]",
            "test_schedule.py::test_seeded", "test_matrix.py::test_cell", "test_sglang_campaign.py::",
            "[summary-overflow]")
# The other long tests are spread over this share of the fast tests (the first part of them): most
# of them wait on purpose (a stalled rank, a sleeping verifier, Ray's start-up timeouts) and, handed
# out together after the heaviest, left both cores half idle for over a minute; beside fast modules,
# whose tests keep a core busy, nothing waits for them.
SPREAD_OVER = 0.6
# Of those, the ones that wait longest are set apart from each other (run together, they idled the
# cores again): the Ray start retry waits out two of Ray's 30 s start-up timeouts (75 s), the other two
# stall ranks and engines for 35 s.
LONGEST_WAITS = ("test_ray_start_retry.py::test_a_stalled", "[gloo-default-timeout]", "[engine-warmup-grace]")


def _rank(item, keys: tuple[str, ...]) -> int:
    return next((i for i, key in enumerate(keys) if key in item.nodeid), len(keys))


def schedule(items: list) -> list:
    """The order xdist hands the tests out in: the heaviest long tests, heaviest first; then the fast
    tests module by module (collection order), with the other long tests between modules, one every
    so many fast tests over the first :data:`SPREAD_OVER` of them, the longest waits far apart."""
    heavy = sorted((i for i in items if _is_long(i) and _rank(i, HEAVIEST) < len(HEAVIEST)),
                   key=lambda i: _rank(i, HEAVIEST))
    rest = [i for i in items if _is_long(i) and _rank(i, HEAVIEST) == len(HEAVIEST)]
    longest = sorted((i for i in rest if _rank(i, LONGEST_WAITS) < len(LONGEST_WAITS)),
                     key=lambda i: _rank(i, LONGEST_WAITS))
    waits = [i for i in rest if i not in longest]
    for k, item in enumerate(longest):  # at 0, 1/3, 2/3 ... of the list
        waits.insert(k * len(rest) // len(longest), item)
    modules: dict[str, list] = {}
    for item in items:
        if not _is_long(item):
            modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    every = SPREAD_OVER * sum(map(len, modules.values())) / max(1, len(waits))  # fast tests between two
    out, handed, j = list(heavy), 0, 0
    for tests in modules.values():
        if j < len(waits) and handed >= j * every:  # one at a time: two handed out together wait together
            out.append(waits[j])
            j += 1
        out += tests
        handed += len(tests)
    return out + waits[j:]


# --- heavy tests: not in the README's command ----------------------------------------------------
# A test marked `heavy` (several ranks training the model for an equality, a chaos scenario a campaign
# long that a faster test already covers in part) runs with `--heavy` (`pytest -q --heavy`: the whole
# suite; `pytest -q --heavy -m heavy`: those alone), or when its file is named on the command line.
# The README's command, which CI runs, leaves them out, so it stays within its 15 minutes on 2 cores
# (docs/testing.md, "Heavy tests").
def pytest_addoption(parser):
    parser.addoption("--heavy", action="store_true", default=False,
                     help="also run the tests marked heavy (left out by default; docs/testing.md 'Heavy tests')")


def pytest_report_header(config):
    if not config.getoption("--heavy"):
        return "heavy tests: left out (run them with --heavy; docs/testing.md 'Heavy tests')"
    return None


def _named_files(config) -> set[str]:
    """Test files named on the command line (a file, or a node id in it), relative to the root."""
    named = set()
    for arg in config.args:
        path = Path(str(arg).split("::", 1)[0])
        path = path if path.is_absolute() else Path(config.invocation_params.dir) / path
        if path.is_file():
            named.add(path.resolve().relative_to(Path(config.rootpath).resolve()).as_posix())
    return named


def _leave_out_heavy(config, items: list) -> None:
    if config.getoption("--heavy"):
        return
    named = _named_files(config)
    left = [i for i in items if i.get_closest_marker("heavy") is not None and i.nodeid.split("::", 1)[0] not in named]
    if left:
        config.hook.pytest_deselected(items=left)
        keep = set(map(id, left))
        items[:] = [i for i in items if id(i) not in keep]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the marks into "@group" node ids:
def pytest_collection_modifyitems(config, items):  # tests/conftest.py loads before xdist's worker plugin
    _leave_out_heavy(config, items)
    # The order of independent tests is free (a module's fast tests keep theirs). xdist keeps this
    # order only with --no-loadscope-reorder (pyproject.toml): by default it hands out the groups with
    # the most tests first, so every single-test campaign started last.
    items[:] = schedule(items)
    for item in items:
        shared = _shared_session_fixture(item)
        if shared is not None:
            item.add_marker(pytest.mark.xdist_group(f"session-fixture-{shared}"))
        elif not _is_long(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
