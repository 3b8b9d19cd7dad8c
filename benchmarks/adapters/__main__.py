"""``python -m benchmarks.adapters``: the engine's cost of LoRA (:func:`benchmarks.adapters.cli.main`);
``... routing``: the router's adapter score (:mod:`.routing`); ``... serving``: four adapters, the app against vLLM's
server and Ray Serve LLM (:mod:`.serving`)."""

import importlib
import sys

if __name__ == "__main__":
    if sys.argv[1:2] in (["routing"], ["serving"]):
        sys.exit(importlib.import_module(f".{sys.argv[1]}", __package__).main(sys.argv[2:]))
    from .cli import main

    sys.exit(main())
