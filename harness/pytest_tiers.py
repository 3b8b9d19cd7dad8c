"""The test suite's tiers as a pytest plugin (tests/README.md): a test's tier is its marker (``unit`` when it has
none); tests run tier by tier, the cheapest first; a test that uses a fixture of a tier above its own fails at once,
naming the marker it needs, and so does one that starts a server, a cluster or an engine through the harness; a shared
session fixture is closed once its last test is done; the time each tier took is printed at the end."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Generator
from typing import Any

import pytest

from . import tiers

GATED_FIXTURES: dict[str, tuple[str, str]] = {
    "serve_instance": ("serve", "the session's Serve cluster"),
    "real_app": ("system", "the real app (serve run serve_config.yaml on vLLM)"),
    "real_app_to_end": ("system", "the real app (serve run serve_config.yaml on vLLM)"),
    "real_core": ("system", "a vLLM engine in the test process"),
}
"""Fixtures that start something, by the tier that may use them (and what they start, for the failure)."""

LAST_IN_TIER = ("real_app_to_end", "own_run_to_end")
"""Fixtures of tests that end or disturb what they run on (the session's real app, a `serve run` of their own
beside it): such tests run after the rest of their tier, when the real app is no longer needed."""


SHARED = {"serve_instance": 0, "real_core": 1, "real_apps": 3}
"""Session fixtures that hold something costly (the session's Serve cluster, a vLLM engine in the test process, the
real app), by the place their tests take within a tier (tests that use none of them take place 2). Each is closed
once the last test that uses it is done, so that later tests do not share the cores with it idling."""


def tier_of(item: pytest.Item) -> str:
    """The highest tier among the item's markers; ``unit`` when it has none."""
    marked = [marker.name for marker in item.iter_markers() if marker.name in tiers.TIERS]
    return max(marked, key=tiers.rank, default="unit")


def ends_what_it_runs_on(item: pytest.Item) -> bool:
    return any(name in getattr(item, "fixturenames", ()) for name in LAST_IN_TIER)


def uses(item: pytest.Item, shared: str) -> bool:
    """Whether the item uses the shared fixture: by name, by a ``shared`` marker (a fixture that takes it with
    ``request.getfixturevalue`` for some of its parameters), or (the session's cluster) by being a ``serve`` test,
    which may reach it through a fixture of its module."""
    declared = {name for marker in item.iter_markers("shared") for name in marker.args}
    return (
        shared in getattr(item, "fixturenames", ())
        or shared in declared
        or (shared == "serve_instance" and tier_of(item) == "serve")
    )


def place(item: pytest.Item) -> tuple[int, bool, int]:
    """Where the item runs: by tier; within one, tests that end what they run on last (in file order), the rest by
    the first shared fixture they use (:data:`SHARED`)."""
    ends = ends_what_it_runs_on(item)
    shared = 0 if ends else min((at for name, at in SHARED.items() if uses(item, name)), default=2)
    return tiers.rank(tier_of(item)), ends, shared


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
    items.sort(key=place)


_closers: dict[str, Callable[[], None]] = {}
_close_after: dict[str, list[str]] = defaultdict(list)
"""Shared fixtures to close after the teardown of a test, by the test's id."""


def close_after_last_use(shared: str, close: Callable[[], None]) -> None:
    """Have the shared fixture ``shared`` (one of :data:`SHARED`) closed by ``close`` once its last test is done;
    ``close`` must do nothing when called again (the fixture's own teardown calls it too)."""
    _closers[shared] = close


def pytest_collection_finish(session: pytest.Session) -> None:
    """Find each shared fixture's last test, moved to the end of that test's module block, where the fixtures of the
    module (which may use the shared one) are torn down."""
    items = session.items
    _close_after.clear()
    for shared in SHARED:
        last = max((at for at, item in enumerate(items) if uses(item, shared)), default=None)
        if last is None:
            continue
        while last + 1 < len(items) and items[last + 1].path == items[last].path:
            last += 1
        _close_after[items[last].nodeid].append(shared)


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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    """After the test's teardown: no test runs, and the shared fixtures whose last test it was are closed."""
    try:
        return (yield)
    finally:
        tiers.current = None
        for shared in _close_after.get(item.nodeid, ()):
            close = _closers.pop(shared, None)
            if close is not None:
                close()


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
