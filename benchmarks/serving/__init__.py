"""OpenAI-compatible servers side by side, measured with vLLM's own benchmark client (``python -m
benchmarks.serving``, see its ``cli``); its peers (``peers``) are the ones other benchmarks start too."""
