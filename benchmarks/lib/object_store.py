"""A local S3 bucket (moto's server on this machine) for peers that load files only from a cloud store: Ray Serve
LLM's multiplexed LoRA takes its adapters from an ``s3://`` folder and nothing else, and nothing here reaches a cloud.
The peer's own S3 client reads the bucket through ``AWS_ENDPOINT_URL_S3``, as it would read AWS's."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.ports import free_port

BUCKET = "adapters"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def local_s3(folders: dict[str, Path]) -> Iterator[tuple[str, dict[str, str]]]:
    """Serve each folder's files under ``s3://adapters/<name>/`` from a local S3 server; yield the bucket's URI and
    the environment a peer's S3 client needs to reach it. Needs ``moto[s3,server]`` (the ``bench`` extra)."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        env = {**CREDENTIALS, "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}"}
        client = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL_S3"],
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        )
        client.create_bucket(Bucket=BUCKET)
        for name, folder in folders.items():
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                client.upload_file(str(path), BUCKET, f"{name}/{path.relative_to(folder).as_posix()}")
        yield f"s3://{BUCKET}", env
    finally:
        server.stop()
