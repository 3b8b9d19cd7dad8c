"""``python -m benchmarks.adapters``: :func:`benchmarks.adapters.cli.main`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
