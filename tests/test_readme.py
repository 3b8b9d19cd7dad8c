"""The README's batching example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_batching_example_runs_as_written():
    (example,) = [block for block in python_blocks() if "from batching import" in block]
    result = subprocess.run([sys.executable, "-c", example], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "['QUESTION 0', 'QUESTION 1']" in result.stdout
