"""``python -m benchmarks.fast_engine``: :func:`benchmarks.fast_engine.cli.main`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
