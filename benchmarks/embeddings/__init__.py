"""Embeddings served side by side over HTTP (``python -m benchmarks.embeddings``, see its ``cli``), and the embedding
core without Ray Serve against vLLM's engine (``python -m benchmarks.embeddings.core``)."""
