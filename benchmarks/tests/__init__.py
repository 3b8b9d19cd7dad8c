"""The benchmarks' own tests: unit tests (no Ray, no engine) of their helpers and of the GPU benchmark on the CPU."""
