"""The README's batching examples run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def run(marker: str) -> str:
    (example,) = [block for block in python_blocks() if marker in block]
    result = subprocess.run([sys.executable, "-c", example], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_batching_example_runs_as_written():
    assert "['QUESTION 0', 'QUESTION 1']" in run("from batching import Prompt, TokenBatcher")


def test_continuous_batching_example_runs_as_written():
    out = run("from batching import ContinuousBatcher, Prompt").splitlines()
    assert out[0] == "['tokens', 'arrive', 'one', 'by', 'one']"
    assert out[1].startswith("['0', '1'] ")  # the last word of each of the first two questions, then a TTFT
