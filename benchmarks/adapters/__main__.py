"""``python -m benchmarks.adapters``: the engine's cost of LoRA (:func:`benchmarks.adapters.cli.main`);
``python -m benchmarks.adapters routing``: the router's adapter score (:func:`benchmarks.adapters.routing.main`)."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["routing"]:
        from .routing import main

        sys.exit(main(sys.argv[2:]))
    from .cli import main

    sys.exit(main())
