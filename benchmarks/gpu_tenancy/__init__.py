"""Online chats beside a batch job on a GPU (``python -m benchmarks.gpu_tenancy``, see its ``cli``): the batching core
in front of transformers' continuous-batching engine (``hf_engine``), where only torch and transformers are."""
