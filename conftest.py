"""Every test folder runs under the suite's tiers (harness/pytest_tiers.py, tests/README.md)."""

pytest_plugins = ["harness.pytest_tiers", "pytester"]  # pytester: tests/test_tiers.py
