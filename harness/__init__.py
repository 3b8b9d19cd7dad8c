"""What the test suite and the benchmarks share to run the app as its users do: free ports, the processes a server
leaves, ``serve.env``, the one launcher of ``serve run serve_config.yaml``, private Ray clusters, vLLM's benchmark
client and percentiles. Neither ``batching`` nor ``serve_app`` imports it."""
