"""``python -m benchmarks.e2e``: :func:`benchmarks.e2e.cli.main`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
