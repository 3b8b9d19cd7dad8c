"""The token-load router against Serve's: on simulated replicas over a local multi-node cluster (``python -m
benchmarks.routing``, see its ``cli``) and on two real vLLM replicas (``python -m benchmarks.routing.real``)."""
