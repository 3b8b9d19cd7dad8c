"""What serving LoRA adapters costs the engine: vLLM's engine without LoRA, and with it (``enable_lora``) serving
the base model and the bundled adapter (``python -m benchmarks.adapters``)."""
