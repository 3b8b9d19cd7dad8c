"""``python -m benchmarks.autoscale``: :func:`benchmarks.autoscale.cli.main`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
