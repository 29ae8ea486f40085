"""Durable landing files: the collector's only way to put rows on disk.

A batch becomes one Parquet file per ``date=/hour=`` partition (and per quarantine partition), each
committed atomically: written under a temporary name beginning with ``.`` (Spark and Hadoop skip such
files, so a reader never sees half a file), flushed and fsync'd, renamed to its final name, and the
partition directory fsync'd so the rename itself survives a power cut. :meth:`LandingWriter.commit`
returns only when every file of the batch is durable; the collector acknowledges nothing before that.
Any failure (disk full, read-only or unwritable directory, I/O error) raises :class:`LandingError` with
one line naming the path and the cause, and leaves no temporary file behind when it can remove it.

The columns and their order are the landing and quarantine tables of :mod:`.schema`.
"""

from __future__ import annotations

import errno
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq

from . import schema

_ARROW = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64(),
          "binary": pa.binary(), "map<string,double>": pa.map_(pa.string(), pa.float64())}


def arrow_schema(columns) -> pa.Schema:
    """The Arrow schema of a :mod:`.schema` table (same names, types and nullability)."""
    return pa.schema([pa.field(n, _ARROW[t], nullable) for n, t, nullable in columns])


LANDING_ARROW = arrow_schema(schema.LANDING_COLUMNS)
QUARANTINE_ARROW = arrow_schema(schema.QUARANTINE_COLUMNS)
TMP_PREFIX = ".tmp-"


class LandingError(OSError):
    """A landing file could not be made durable; the message is one line with the path and cause
    (``errno`` keeps the system's error number)."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def safe_name(text: str) -> str:
    """``text`` usable inside a file name (collector ids may hold any MQTT client id character)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text) or "_"


def _why(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return "no space left on device (disk full)"
    if e.errno == errno.EDQUOT:
        return "disk quota exceeded"
    if e.errno == errno.EROFS:
        return "read-only file system"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return e.strerror or str(e)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LandingWriter:
    """Writes a collector's batches under ``root``.

    File names: ``part-<collector>-<first recv_idx>.parquet`` (landing) and ``q-...`` (quarantine);
    ``recv_idx`` is unique per collector and never repeats across its restarts (see the collector), so
    names never collide and a rename never replaces another file.
    """

    def __init__(self, root: str, collector: str):
        self.root = os.path.abspath(root)
        self.tag = safe_name(collector)
        self._known_dirs: set[str] = set()
        self.files = 0
        self.bytes = 0

    # --- directories --------------------------------------------------------------------------

    def _ensure_dir(self, path: str) -> None:
        """Create ``path`` and any missing parents, fsyncing each parent whose entries changed."""
        if path in self._known_dirs:
            return
        missing = []
        p = path
        while not os.path.isdir(p):
            missing.append(p)
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                if not os.path.isdir(d):
                    raise LandingError(errno.ENOTDIR, f"cannot create directory {d}: a file is in the way")
            except OSError as e:
                raise LandingError(e.errno, f"cannot create directory {d}: {_why(e)}") from None
            try:
                fsync_dir(os.path.dirname(d))
            except OSError as e:
                raise LandingError(e.errno, f"cannot fsync directory {os.path.dirname(d)}: {_why(e)}") \
                    from None
        self._known_dirs.add(path)

    def check(self) -> None:
        """Fail now, with a clear error, if ``root`` cannot take durable files (before connecting)."""
        self._ensure_dir(self.root)
        probe = os.path.join(self.root, f"{TMP_PREFIX}{self.tag}-probe")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, b"tern")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.unlink(probe)
        except OSError as e:
            _unlink_quietly(probe)
            raise LandingError(e.errno, f"landing directory {self.root} is not writable: {_why(e)}") \
                from None

    def remove_stale_temps(self) -> int:
        """Delete temporary files this collector left when it was killed mid-write; returns how many."""
        prefix = f"{TMP_PREFIX}{self.tag}-"
        n = 0
        for top in (self.root, os.path.join(self.root, schema.QUARANTINE_DIR)):
            for date in _subdirs(top, "date="):
                for hour in _subdirs(date, "hour="):
                    for entry in os.scandir(hour):
                        if entry.name.startswith(prefix):
                            _unlink_quietly(entry.path)
                            n += 1
        return n

    # --- commit -------------------------------------------------------------------------------

    def _write_file(self, directory: str, name: str, table: pa.Table) -> None:
        self._ensure_dir(directory)
        final = os.path.join(directory, name)
        tmp = os.path.join(directory, f"{TMP_PREFIX}{self.tag}-{name}")
        try:
            with open(tmp, "xb") as f:
                pq.write_table(table, f)
                f.flush()
                os.fsync(f.fileno())
                size = f.tell()
            if os.path.exists(final):
                raise LandingError(errno.EEXIST, f"landing file {final} exists already (two collectors "
                                                 "with the same --id?)")
            os.rename(tmp, final)
            fsync_dir(directory)
        except LandingError:
            _unlink_quietly(tmp)
            raise
        except OSError as e:
            _unlink_quietly(tmp)
            raise LandingError(e.errno, f"cannot write landing file {final}: {_why(e)}") from None
        self.files += 1
        self.bytes += size

    def commit(self, rows: dict, quarantine: dict) -> int:
        """Make a batch durable. ``rows`` and ``quarantine`` are column lists (``{name: [values]}``,
        every landing/quarantine column present, ``recv_ts`` included); returns the files written."""
        before = self.files
        for cols, arrow, prefix, base in (
                (rows, LANDING_ARROW, "part", self.root),
                (quarantine, QUARANTINE_ARROW, "q", os.path.join(self.root, schema.QUARANTINE_DIR))):
            if not cols["recv_ts"]:
                continue
            for (date, hour), idx in _by_partition(cols["recv_ts"]).items():
                part = {k: [v[i] for i in idx] for k, v in cols.items()} if len(idx) < len(
                    cols["recv_ts"]) else cols
                table = pa.Table.from_pydict({n: part[n] for n in arrow.names}, schema=arrow)
                first = part["_idx"][0]
                self._write_file(os.path.join(base, f"date={date}", f"hour={hour}"),
                                 f"{prefix}-{self.tag}-{first:020d}.parquet", table)
        return self.files - before


def _by_partition(recv_ts: list) -> dict:
    """Row indices grouped by ``(date, hour)``, in arrival order (almost always a single group)."""
    groups: dict = {}
    last_hour, key = None, None
    for i, ts in enumerate(recv_ts):
        h = int(ts // 3600)
        if h != last_hour:
            last_hour, key = h, schema.partition_values(ts)
        groups.setdefault(key, []).append(i)
    return groups


def _subdirs(path: str, prefix: str):
    try:
        return [e.path for e in os.scandir(path) if e.is_dir() and e.name.startswith(prefix)]
    except FileNotFoundError:
        return []


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
