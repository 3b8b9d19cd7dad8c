"""Progress a person can read while a job runs: rows done of the total, output tokens/s, ETA and errors, logged
every few seconds (Ray Data's own bar counts rows per operator only).

The job's map actors report each batch they finish to one small counter actor; the driver polls it::

    with JobProgress(total=rows) as progress:
        generate(ds, ..., progress=progress.counter).write_json("out/")
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)


class ProgressCounter:
    """Rows, tokens and errors reported by a job's map actors (a Ray actor: ``counter()`` starts one)."""

    def __init__(self) -> None:
        self.rows = self.tokens = self.errors = 0

    def add(self, rows: int, tokens: int, errors: int) -> None:
        self.rows += rows
        self.tokens += tokens
        self.errors += errors

    def totals(self) -> dict[str, int]:
        return {"rows": self.rows, "tokens": self.tokens, "errors": self.errors}


def counter() -> Any:
    """A new counter actor (no CPU of its own: it only adds numbers)."""
    import ray

    return ray.remote(num_cpus=0)(ProgressCounter).remote()


def report(progress: Any, results: list[dict[str, Any]], tokens_key: str) -> None:
    """Tell ``progress`` (a counter actor, or None) about one finished batch of result rows; fire and forget."""
    if progress is not None:
        tokens = sum(r.get(tokens_key) or 0 for r in results)
        progress.add.remote(len(results), tokens, sum(r.get("error") is not None for r in results))


def describe(totals: dict[str, int], total: int, elapsed_s: float, tokens: str = "output tok/s") -> str:
    """One progress line: ``rows 1200/2000 (60%), 71.3 output tok/s, ETA 35 s, 0 errors``."""
    rows = totals["rows"]
    rate = rows / elapsed_s if elapsed_s > 0 else 0.0
    eta = f"{(total - rows) / rate:.0f} s" if rate > 0 else "unknown"
    share = f" ({100 * rows / total:.0f}%)" if total else ""
    tok_s = totals["tokens"] / elapsed_s if elapsed_s > 0 else 0.0
    return f"rows {rows}/{total}{share}, {tok_s:.1f} {tokens}, ETA {eta}, {totals['errors']} errors"


class JobProgress:
    """Logs a job's progress every ``period_s`` while the ``with`` block runs, and once at its end."""

    def __init__(self, total: int, period_s: float = 10.0, tokens: str = "output tok/s") -> None:
        self.total, self.period_s, self.tokens = total, period_s, tokens
        self.counter = counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-progress", daemon=True)
        self.lines: list[str] = []

    def __enter__(self) -> JobProgress:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if exc_type is None:
            self._settle()
        self.log()

    def _settle(self, timeout_s: float = 10.0) -> None:
        """Wait (a little) for the last batches' reports, sent fire-and-forget, to reach the counter."""
        import ray

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ray.get(self.counter.totals.remote(), timeout=30)["rows"] >= self.total:
                return
            time.sleep(0.05)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.log()

    def log(self) -> None:
        import ray

        try:
            totals = ray.get(self.counter.totals.remote(), timeout=30)
        except Exception as exc:  # progress must never fail the job
            logger.warning("progress unavailable: %r", exc)
            return
        line = describe(totals, self.total, time.monotonic() - self._started, self.tokens)
        self.lines.append(line)
        logger.info("progress: %s", line)
