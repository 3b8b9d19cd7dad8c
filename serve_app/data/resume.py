"""Resumable jobs on Ray Data's row-level checkpointing: a job written to files records the ids of the rows it has
written (``ray.data.checkpoint.CheckpointConfig``); run again with the same checkpoint, it reads only the rows
whose ids are not recorded, so the output holds every id once.

Ray Data filters rows right after the read and records them at the write, so the id column must come out of the
reader itself: :func:`read` gives inputs without one a stable id from file and row position
(``"problems.jsonl:41"``), and :func:`checkpointed` turns checkpointing on for a dataset.
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from ray.data.datasource import FileBasedDatasource

logger = logging.getLogger(__name__)

READERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
IO_CPUS = 0.25
"""CPUs each read or write task asks for. Ray Data's default is a whole CPU, which on a small machine
whose replicas hold most CPUs would never be free: the job would wait forever. These tasks are I/O."""

RESUME_CPUS = 1.5
"""CPUs a resumed job needs free: Ray Data's checkpoint filter asks a whole one (no setting changes it), and the
job's own read, map and write tasks must still fit beside it, or the read waits forever behind the filter."""
FREE_CPU_WAIT_S = 60.0
"""How long a resumed job waits for :data:`RESUME_CPUS` free before it refuses to start."""

PENDING_SUFFIX = ".pending.parquet"
"""Ray Data's name for a block's checkpoint written before its data and not yet committed."""


def local_path(path: str) -> str:
    """A local path made absolute from this process's folder, as its caller means it: Ray Data's tasks open it in
    worker processes, whose folder is the cluster's. A URI (``s3://...``) is left as it is."""
    return path if "://" in path else str(Path(path).expanduser().absolute())


def input_kind(path: str) -> str:
    """The reader a file or folder needs, by extension (a folder is JSONL unless it holds Parquet)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if p.is_dir():
        suffix = ".parquet" if any(p.glob("*.parquet")) else ".jsonl"
    kind = READERS.get(suffix)
    if kind is None:
        raise ValueError(f"cannot read '{path}': use .jsonl, .json, .parquet or .csv")
    return kind


LOCAL_SHAPE_BYTES = 256 << 20
"""Inputs on this machine up to this size are measured (their columns and rows) by the driver itself: a Ray Data
execution to count them costs seconds of task start-up on a small machine, each time."""


def local_files(path: str, kind: str | None = None) -> list[Path] | None:
    """A local input's files of ``kind`` (by extension where not given), a file or a folder of them, when they
    hold at most :data:`LOCAL_SHAPE_BYTES` in all; None for anything else, which Ray Data then reads."""
    root = Path(path)
    kind = kind or input_kind(path)
    suffixes = {suffix for suffix, k in READERS.items() if k == kind}
    files = sorted(f for f in root.iterdir() if f.is_file()) if root.is_dir() else [root] if root.is_file() else []
    if not files or (root.is_dir() and any(f.suffix.lower() not in suffixes for f in files)):
        return None
    if sum(f.stat().st_size for f in files) > LOCAL_SHAPE_BYTES:
        return None
    return files


def local_shape(path: str, kind: str | None = None) -> tuple[list[str], int] | None:
    """The columns and row count of a local input (:func:`local_files`), read here as the job's read tasks read
    it; None for anything else, which Ray Data then measures."""
    kind = kind or input_kind(path)
    files = local_files(path, kind)
    if files is None:
        return None
    columns: list[str] = []
    rows = 0
    for file in files:
        with open(file, "rb") as f:
            for table in file_tables(f, kind):
                columns += [name for name in table.column_names if name not in columns]
                rows += table.num_rows
    return columns, rows


def unwritten_rows(path: str, checkpoint: str | Path, id_column: str, kind: str | None = None) -> int | None:
    """How many rows of a local input (:func:`local_files`) a checkpoint does not record as written, by their ids
    (the input's own ``id_column``, else :func:`positioned`'s); None for an input not read here. A rerun of a
    finished job can end here, before Ray Data starts its actors and its checkpoint filter asks for a CPU."""
    kind = kind or input_kind(path)
    files = local_files(path, kind)
    if files is None:
        return None
    written = recorded_ids(checkpoint, id_column)
    root = id_root(path)
    left = 0
    for file in files:
        with open(file, "rb") as f:
            for table in numbered_tables(f, kind, os.path.relpath(file.resolve(), root), id_column):
                left += sum(1 for row_id in table[id_column].to_pylist() if row_id not in written)
    return left


def nothing_left(
    path: str, checkpoint: str | Path, id_column: str, rows: int, recorded: int, kind: str | None = None
) -> bool:
    """Whether a resumed job over a local input of ``rows`` rows, whose checkpoint records ``recorded``, has
    every row written (:func:`unwritten_rows`). The ids are read only where the checkpoint holds as many rows as
    the input: with fewer, some row is left for certain, and a partial resume does not read its input twice."""
    return 0 < recorded >= rows and unwritten_rows(path, checkpoint, id_column, kind) == 0


def read(path: str, id_column: str | None = None, blocks: int | None = None, columns: list[str] | None = None) -> Any:
    """A Ray Dataset from a file or folder, by extension. With ``id_column``, rows that the files do not already
    number get that column: ``"<file>:<row>"``, stable across runs (what a checkpoint needs). ``blocks`` splits
    what is read into about that many blocks (a checkpoint records a block at a time), in the read tasks.
    ``columns``: the input's own, where known (:func:`local_shape`); else Ray Data reads them. A relative path is
    from this process's folder (:func:`local_path`)."""
    import ray.data

    path = local_path(path)
    kind = input_kind(path)
    # JSON through Arrow's reader, which reads JSON lines too: Ray's ``lines=True`` reader makes pandas blocks, which
    # Ray Data's checkpoint filter refuses (an AssertionError on resume when the input has its own ids).
    ds = getattr(ray.data, f"read_{kind}")(path, num_cpus=IO_CPUS, override_num_blocks=blocks)
    if id_column is None or id_column in (ds.columns() if columns is None else columns):
        return ds
    return positioned(path, kind, id_column, blocks)


def positioned(path: str, kind: str, id_column: str, blocks: int | None = None) -> Any:
    """A Ray Dataset of ``kind`` files (``json``, ``csv``, ``parquet``, or ``text``: one row a non-blank line, in
    column ``text``) with ``id_column`` set to ``"<file>:<row>"``, in about ``blocks`` blocks."""
    import ray.data

    source = PositionedFiles(path, kind=kind, id_column=id_column, root=id_root(path))
    return ray.data.read_datasource(source, num_cpus=IO_CPUS, override_num_blocks=blocks)


class PositionedFiles(FileBasedDatasource):
    """JSON(L), CSV, Parquet or text files with an id column added from each row's file and position in it. A
    file is read by one task, in order, so the position is the row's line (JSONL, text) or row (CSV, Parquet)
    number, counted from 0."""

    def __init__(self, paths: str, *, kind: str, id_column: str, root: str) -> None:
        extensions = [e.lstrip(".") for e, k in READERS.items() if k == kind] or None
        super().__init__(paths, file_extensions=extensions)
        self.kind, self.id_column, self.root = kind, id_column, root

    def _open_input_source(self, filesystem: Any, path: str, **open_args: Any) -> Any:
        if self.kind == "parquet":  # Parquet's footer comes first: it needs random access, not a stream
            return filesystem.open_input_file(path)
        return super()._open_input_source(filesystem, path, **open_args)

    def _read_stream(self, f: Any, path: str) -> Iterator[pa.Table]:
        yield from numbered_tables(f, self.kind, os.path.relpath(path, self.root), self.id_column)


def id_root(path: str) -> str:
    """The folder a positioned id's file name is relative to: the input's own, or the input folder."""
    return str(Path(path).resolve().parent if Path(path).is_file() else Path(path).resolve())


def numbered_tables(f: Any, kind: str, name: str, id_column: str) -> Iterator[pa.Table]:
    """One file's rows (``f``, open for reading bytes; ``name``, its path from :func:`id_root`) with ``id_column``:
    the file's own where it has one, else ``"<name>:<row>"``, counted from 0 (a text file's blank lines keep
    their numbers)."""
    row = 0
    for table in positioned_tables(f, kind):
        if id_column not in table.column_names:
            ids = pa.array([f"{name}:{i}" for i in range(row, row + table.num_rows)], type=pa.string())
            table = table.append_column(id_column, ids)
        row += table.num_rows
        yield _rows(table, kind)


def file_tables(f: Any, kind: str) -> Iterator[pa.Table]:
    """One file's rows (``f``, open for reading bytes), as tables."""
    for table in positioned_tables(f, kind):
        yield _rows(table, kind)


def _rows(table: pa.Table, kind: str) -> pa.Table:
    """A file's rows: a text file's blank lines are none."""
    return table.filter(pc.not_equal(pc.utf8_trim_whitespace(table["text"]), "")) if kind == "text" else table


def positioned_tables(f: Any, kind: str) -> Iterator[pa.Table]:
    """One file's rows in order, every line of a text file included (its position counts blank lines too)."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(f).iter_batches():
            yield pa.Table.from_batches([batch])
    elif kind == "text":
        lines = [line.rstrip("\r") for line in f.read().decode("utf-8", errors="replace").split("\n")]
        yield pa.table({"text": pa.array(lines, type=pa.string())})
    elif kind == "csv":
        import pyarrow.csv as pcsv

        yield pcsv.read_csv(f)
    else:
        data = f.read()
        if data.lstrip()[:1] == b"[":  # one JSON array rather than one object a line
            yield pa.Table.from_pylist(json.loads(data))
        else:
            import pyarrow.json as pjson

            yield pjson.read_json(io.BytesIO(data))


def checkpointed(ds: Any, path: str | Path, id_column: str = "id") -> Any:
    """``ds`` with Ray Data's row-level checkpointing at ``path`` (a folder), keyed by ``id_column``: when the
    dataset is written to files (``write_json``, ``write_parquet``), each written block's ids are recorded, and a
    later run of the same job with the same ``path`` skips them. ``ds`` must descend from a read (Ray Data filters
    right after it) with unique ids that every later step keeps; datasets made from it share the setting. A block
    is what is written and recorded at once: read in several (``read(..., blocks=N)``), or a killed job redoes the
    whole input. The checkpoint is kept after success, so a rerun writes nothing twice.

    Ray Data's filter of recorded rows is an actor that asks a whole CPU (it cannot be told otherwise): resuming
    on a cluster without :data:`RESUME_CPUS` free would wait forever, so that is refused here, naming the problem."""
    from ray.data.checkpoint import CheckpointConfig

    recorded = checkpointed_rows(path, id_column)
    free = wait_for_free_cpus() if recorded else None
    if free is not None and free < RESUME_CPUS:
        raise ValueError(
            f"cannot resume from '{path}' ({recorded} rows recorded): Ray Data's checkpoint filter needs a whole "
            f"CPU, the job {RESUME_CPUS:g} in all, and the cluster has had {free:g} free for {FREE_CPU_WAIT_S:g} s; "
            "free some (fewer or smaller replicas), or run afresh"
        )
    ds.context.checkpoint_config = CheckpointConfig(
        id_column=id_column, checkpoint_path=str(Path(path).resolve()), delete_checkpoint_on_success=False
    )
    return ds


def wait_for_free_cpus(timeout_s: float | None = None) -> float | None:
    """CPUs free in the connected Ray cluster (None when not connected), once :data:`RESUME_CPUS` are, or after
    ``timeout_s`` (default :data:`FREE_CPU_WAIT_S`): a killed run's actors take a few seconds to let theirs go."""
    import ray

    if not ray.is_initialized():
        return None
    deadline = time.monotonic() + (FREE_CPU_WAIT_S if timeout_s is None else timeout_s)
    while (free := ray.available_resources().get("CPU", 0.0)) < RESUME_CPUS and time.monotonic() < deadline:
        logger.info("resuming: waiting for %g CPUs (Ray Data's checkpoint filter asks one); %g free", RESUME_CPUS, free)
        time.sleep(1.0)
    return free


def recorded_files(path: str | Path) -> list[Path]:
    """A checkpoint folder's committed files (none where there is no folder)."""
    folder = Path(path)
    if not folder.is_dir():
        return []
    return [f for f in folder.glob("*.parquet") if not f.name.endswith(PENDING_SUFFIX)]


def checkpointed_rows(path: str | Path, id_column: str = "id") -> int:
    """How many rows a checkpoint folder records as written (committed blocks only)."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(f).num_rows for f in recorded_files(path))


def recorded_ids(path: str | Path, id_column: str) -> set[Any]:
    """The ids a checkpoint folder records as written (committed blocks only)."""
    import pyarrow.parquet as pq

    return {
        row_id for f in recorded_files(path) for row_id in pq.read_table(f, columns=[id_column])[id_column].to_pylist()
    }
