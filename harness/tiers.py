"""The test suite's tiers, by what a test starts, and the check the launchers make: a test that starts something of
a tier above its own marker fails at once, naming the marker it needs. Outside pytest (a benchmark) nothing is
checked."""

from __future__ import annotations

TIERS = ("unit", "serve", "system", "soak")
"""In order of cost: ``unit`` starts nothing (no Ray, no engine); ``serve`` sends requests to apps of one replica on
the session's Serve cluster (simulated engine); ``system`` starts a real vLLM engine, a cluster of its own or a ``serve
run``, or sets the session's fleet to work (Ray Data jobs, drivers, replicas added, replaced, killed or stopped);
``soak`` runs load and fault tests at full size and anything that measures."""

current: tuple[str, str] | None = None
"""(test id, tier) of the test running now; set by the tier plugin (harness/pytest_tiers.py), None outside a test."""


class TierError(Exception):
    """A test started something its tier does not allow."""


def rank(tier: str) -> int:
    return TIERS.index(tier)


def require(tier: str, what: str) -> None:
    """Raise :class:`TierError` if the running test's tier is below ``tier``; ``what`` names what it started."""
    if current is None:
        return
    test, own = current
    if rank(own) < rank(tier):
        raise TierError(
            f"{test} starts {what}, which belongs to the {tier!r} tier, but it is marked {own!r}: "
            f"mark it @pytest.mark.{tier} (tests/README.md)"
        )
