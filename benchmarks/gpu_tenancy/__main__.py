"""``python -m benchmarks.gpu_tenancy``: :func:`benchmarks.gpu_tenancy.cli.main`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
