"""``python -m benchmarks.embeddings``: :func:`benchmarks.embeddings.cli.main`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
