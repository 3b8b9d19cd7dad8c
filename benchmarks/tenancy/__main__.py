"""``python -m benchmarks.tenancy``: :func:`benchmarks.tenancy.cli.main`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
