"""The serving path's own cost at GPU token rates: a tiny random model makes vLLM's CPU engine step in
milliseconds, so what the serving layer adds to each token shows (``python -m benchmarks.fast_engine``); the
generation core without Serve or HTTP against vLLM's engine driven directly: ``python -m
benchmarks.fast_engine.core``."""
