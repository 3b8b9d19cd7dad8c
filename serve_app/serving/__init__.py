"""The Ray Serve layer: thin deployments over the cores (:mod:`.llm`, :mod:`.embeddings`) on one replica skeleton
(:mod:`.replica`), the HTTP door and error answers, deployment options, token-aware autoscaling, metrics."""
