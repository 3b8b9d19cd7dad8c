"""The HTTP protocol, one module per endpoint as vLLM's ``entrypoints/openai/`` has it: each holds the request
model (OpenAI's whole schema plus vLLM's extensions), what of it this server refuses (400 naming the field), and
the response and stream-chunk formatting (the ``openai`` package's own models).

These models are written here rather than imported from ``vllm.entrypoints.openai``: vLLM's protocol modules import
torch and vLLM's engine configuration, which the simulated engine (and a Ray Serve install without vLLM) must not
need."""
