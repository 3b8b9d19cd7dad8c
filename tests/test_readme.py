"""The README and docs/ as written: every Python example that needs no running app runs, the README stays a page to
start from, and every relative link points at a file (and heading) that exists.

Examples that need `make serve` running (they reach ``localhost:8000`` or join its cluster with
``ray.init(address="auto")``) are run elsewhere: tests/test_real_app.py runs the README's handle example.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
HISTORY = sorted((ROOT / "benchmarks" / "results").glob("*-history.md"))
MAX_README_LINES = 300

APP_MARKERS = ("localhost:8000", 'ray.init(address="auto"')
"""What an example that needs the running app contains."""

FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def needs_app(block: str) -> bool:
    return any(marker in block for marker in APP_MARKERS)


STANDALONE = [
    pytest.param(block, id=f"{name(page)}-{index}")
    for page in [README, *DOCS]
    for index, block in enumerate(python_blocks(page))
    if not needs_app(block)
]


@functools.cache
def run(example: str) -> str:
    result = subprocess.run([sys.executable, "-c", example], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def example_with(marker: str) -> str:
    (block,) = [b for page in [README, *DOCS] for b in python_blocks(page) if marker in b]
    return block


@pytest.mark.parametrize("example", STANDALONE)
def test_every_example_that_needs_no_running_app_runs_as_written(example):
    run(example)


def test_batching_example_runs_as_written():
    assert "['QUESTION 0', 'QUESTION 1']" in run(example_with("from batching import Prompt, TokenBatcher"))


def test_continuous_batching_example_runs_as_written():
    out = run(example_with("from batching import ContinuousBatcher, Prompt")).splitlines()
    assert out[0] == "['tokens', 'arrive', 'one', 'by', 'one']"
    assert out[1].startswith("['0', '1'] ")  # the last word of each of the first two questions, then a TTFT


def test_readme_has_exactly_one_handle_example():
    """tests/test_real_app.py runs the one README block that calls ``get_app_handle``."""
    handles = [b for b in python_blocks(README) if "get_app_handle" in b]
    assert len(handles) == 1 and 'serve.get_app_handle("llm")' in handles[0]
    assert needs_app(handles[0])


def test_readme_is_a_page_to_start_from():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    assert "results:start" not in text  # benchmarks.run no longer writes into the README


def test_readme_links_every_docs_page():
    linked = {target.split("#")[0] for target in links(README)}
    assert {name(page) for page in DOCS} <= linked


def links(page: Path) -> list[str]:
    """The targets of the Markdown links and images in ``page``, outside code."""
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text()))
    return LINK.findall(text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (not ``-`` or ``_``), spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", FENCE.sub("", page.read_text()), flags=re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


@pytest.mark.parametrize("page", [README, *DOCS, *HISTORY], ids=name)
def test_relative_links_point_at_files_that_exist(page):
    broken = []
    for target in links(page):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading '{anchor}' in {name(file)}")
    assert not broken, f"{name(page)}: " + "; ".join(broken)


def yaml_blocks(page: Path) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S)


APP_ARGS = [
    pytest.param(block, id=f"{name(page)}-{index}")
    for page in DOCS
    for index, block in enumerate(yaml_blocks(page))
    if re.match(r"(#.*\n)*args:", block)
]


@pytest.mark.parametrize("block", APP_ARGS)
def test_every_app_args_example_is_a_valid_configuration(block):
    """A docs example of the generation app's ``args`` (a block that starts with ``args:``) is accepted as is."""
    import yaml

    from serve_app.config import AppConfig

    AppConfig.model_validate(yaml.safe_load(block)["args"])


def test_the_fleet_page_shows_its_settings():
    assert len([p for p in APP_ARGS if "fleet.md" in p.id]) >= 5
