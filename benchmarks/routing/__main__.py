"""``python -m benchmarks.routing``: :func:`benchmarks.routing.cli.main`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
