"""A Ray Serve + vLLM application on the ``batching`` library: engines behind token-aware batchers (``core``), the
OpenAI protocol (``openai``), thin Serve deployments on one replica skeleton (``serving``), and Ray Data jobs
(``data``). Entry points: ``serve_app.app`` (the builders ``serve_config.yaml`` imports), ``python -m
serve_app.driver``, ``python -m serve_app.models``, ``python -m serve_app.sample``."""
