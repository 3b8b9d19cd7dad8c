"""The tiers hold (tests/README.md): a test that starts something of a tier above its marker fails at once, with a
message naming the marker it needs, before anything starts; unmarked tests are ``unit``. Run on a deliberately
mis-marked suite in a pytest of its own, with the real suite's fixtures, and (what needs the session's cluster) in
the serve tier itself."""

from __future__ import annotations

import pytest

from harness.environment import ROOT

CONFTEST = """
pytest_plugins = ["harness.pytest_tiers"]
from tests.conftest import engine_loop, system_tier_gate, real_app, real_apps, real_core, serve_instance
"""

MISMARKED = """
import pytest


def test_an_unmarked_test_asks_for_a_vllm_engine(real_core):
    pass


@pytest.mark.serve
def test_a_serve_test_asks_for_the_real_app(real_app):
    pass


def test_an_unmarked_test_asks_for_the_serve_cluster(serve_instance):
    pass


def test_an_unmarked_test_starts_serve_run(tmp_path):
    from harness.launcher import serve_run

    serve_run(tmp_path)


def test_an_unmarked_test_starts_a_vllm_engine_itself():
    from serve_app.config import VLLMSettings
    from serve_app.engines.vllm_engine import VLLMEngine

    VLLMEngine("a-model", VLLMSettings())


@pytest.mark.system
def test_a_system_test_may_start_what_its_tier_allows():
    from harness import tiers

    tiers.require("system", "a vLLM engine")


def test_an_unmarked_test_is_unit(request):
    assert request.node.get_closest_marker("unit") is not None
"""


def test_mis_marked_tests_fail_at_once_naming_the_marker_they_need(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_mismarked=MISMARKED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "addopts=", "-rfE", "-vv")
    result.assert_outcomes(passed=2, failed=2, errors=3)
    summary = {
        line.split("::")[1].split()[0]: line for line in result.stdout.lines if line.startswith(("FAILED", "ERROR"))
    }
    assert summary.keys() == {
        "test_an_unmarked_test_asks_for_a_vllm_engine",
        "test_a_serve_test_asks_for_the_real_app",
        "test_an_unmarked_test_asks_for_the_serve_cluster",
        "test_an_unmarked_test_starts_serve_run",
        "test_an_unmarked_test_starts_a_vllm_engine_itself",
    }, summary
    for test, line in summary.items():
        marker = "serve" if test.endswith("serve_cluster") else "system"
        assert f"mark it @pytest.mark.{marker}" in line, line


SHARED_CONFTEST = """
import pytest

from harness.pytest_tiers import close_after_last_use

pytest_plugins = ["harness.pytest_tiers"]
EVENTS = []


@pytest.fixture(scope="session")
def real_core():
    EVENTS.append("started")
    close_after_last_use("real_core", lambda: EVENTS.append("closed"))
    yield
"""

USERS = """
import pytest

from conftest import EVENTS


@pytest.mark.system
def test_a_uses_it(real_core):
    EVENTS.append("a")


@pytest.mark.system
def test_c_uses_it(real_core):
    EVENTS.append("c")
"""

NON_USER = """
import pytest

from conftest import EVENTS


@pytest.mark.system
def test_b_uses_none():
    assert EVENTS == ["started", "a", "c", "closed"]
"""


def test_a_shared_fixtures_tests_run_together_and_it_is_closed_after_the_last(pytester, monkeypatch):
    """``real_core``'s tests run first in their tier, wherever their files sort, and it is closed after them."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest(SHARED_CONFTEST)
    pytester.makepyfile(test_a_none=NON_USER, test_b_users=USERS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "addopts=", "-v")
    result.assert_outcomes(passed=3)
    assert [line.split("::")[1].split()[0] for line in result.stdout.lines if " PASSED" in line] == [
        "test_a_uses_it",
        "test_c_uses_it",
        "test_b_uses_none",
    ]


@pytest.mark.serve
def test_a_serve_test_that_sets_the_fleet_to_work_fails_naming_the_system_marker(deploy_app):
    """On the session's cluster a ``serve`` test may send requests to apps of one replica; a Ray Data job, a killed
    actor or a second replica is the ``system`` tier's, refused before it starts."""
    import ray
    import ray.data

    from harness.tiers import TierError

    cases = {
        "a Ray Data job": lambda: ray.data.range(3).take_all(),
        "killing a Ray actor": lambda: ray.kill("no actor"),  # without the gate, Ray's own ValueError
        "an app of more than one replica": lambda: deploy_app("two", autoscaling={"max_replicas": 2}),
    }
    for what, start in cases.items():
        with pytest.raises(TierError, match=r"mark it @pytest\.mark\.system") as refused:
            start()
        assert what in str(refused.value)
