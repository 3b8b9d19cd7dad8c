"""The test suite's tiers as a pytest plugin (tests/README.md): a test's tier is its marker (``unit`` when it has
none); tests run tier by tier, the cheapest first; a test that uses a fixture of a tier above its own fails at once,
naming the marker it needs, and so does one that starts a server, a cluster or an engine through the harness; the
time each tier took is printed at the end."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from . import tiers

GATED_FIXTURES: dict[str, tuple[str, str]] = {
    "serve_instance": ("serve", "the session's Serve cluster"),
    "real_app": ("system", "the real app (serve run serve_config.yaml on vLLM)"),
    "real_app_to_end": ("system", "the real app (serve run serve_config.yaml on vLLM)"),
    "real_apps": ("system", "the real app (serve run serve_config.yaml on vLLM)"),
    "real_core": ("system", "a vLLM engine in the test process"),
}
"""Fixtures that start something, by the tier that may use them (and what they start, for the failure)."""

LAST_IN_TIER = ("real_app_to_end", "own_run_to_end")
"""Fixtures of tests that end or disturb what they run on (the session's real app, a `serve run` of their own
beside it): such tests run after the rest of their tier, when the real app is no longer needed."""


def tier_of(item: pytest.Item) -> str:
    """The highest tier among the item's markers; ``unit`` when it has none."""
    marked = [marker.name for marker in item.iter_markers() if marker.name in tiers.TIERS]
    return max(marked, key=tiers.rank, default="unit")


def ends_what_it_runs_on(item: pytest.Item) -> bool:
    return any(name in getattr(item, "fixturenames", ()) for name in LAST_IN_TIER)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier",
        action="append",
        choices=tiers.TIERS,
        help="run only the tests of this tier (by their highest tier marker; repeat for several)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tiers asked for (``--tier``), mark unmarked tests ``unit`` (so ``-m unit`` selects them) and run
    tier by tier, in file order within one."""
    wanted = config.getoption("tier")
    if wanted:
        dropped = [item for item in items if tier_of(item) not in wanted]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if tier_of(item) in wanted]
    for item in items:
        if tier_of(item) == "unit":
            item.add_marker(pytest.mark.unit)
    items.sort(key=lambda item: (tiers.rank(tier_of(item)), ends_what_it_runs_on(item)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a test that uses a fixture of a higher tier before any fixture runs; tell the harness the test's tier."""
    tier = tier_of(item)
    tiers.current = (item.nodeid, tier)
    for name in getattr(item, "fixturenames", ()):
        if name in GATED_FIXTURES:
            need, what = GATED_FIXTURES[name]
            if tiers.rank(tier) < tiers.rank(need):
                pytest.fail(
                    f"{item.nodeid} uses {name} ({what}), which belongs to the {need!r} tier, but it is marked "
                    f"{tier!r}: mark it @pytest.mark.{need} (tests/README.md)",
                    pytrace=False,
                )


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    tiers.current = None


_seconds: dict[str, float] = defaultdict(float)
_tests: dict[str, set[str]] = defaultdict(set)
_tier_by_id: dict[str, str] = {}


def pytest_itemcollected(item: pytest.Item) -> None:
    _tier_by_id[item.nodeid] = tier_of(item)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = _tier_by_id.get(report.nodeid, "unit")
    _seconds[tier] += report.duration
    _tests[tier].add(report.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The time each tier took (set-up, call and teardown of its tests; a shared fixture counts where it starts)."""
    if not _seconds:
        return
    terminalreporter.section("time per tier")
    for tier in tiers.TIERS:
        if tier in _seconds:
            terminalreporter.write_line(f"{tier}: {_seconds[tier]:.0f} s, {len(_tests[tier])} tests")
