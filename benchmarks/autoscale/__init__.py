"""Autoscaling on ongoing requests against autoscaling on tokens, and how fast Serve's metric pipeline reacts
(``python -m benchmarks.autoscale``, see its ``cli``)."""
