"""Durable landing files: the collector's only way to put rows on disk.

A batch becomes one Parquet file per ``date=/hour=`` partition (and per quarantine partition), each
committed atomically: written under a temporary name beginning with ``.`` (Spark and Hadoop skip such
files, so a reader never sees half a file), flushed and fsync'd, renamed to its final name, and the
partition directory fsync'd so the rename itself survives a power cut. :meth:`LandingWriter.commit`
returns only when every file of the batch is durable; the collector acknowledges nothing before that.
Any failure (disk full, read-only or unwritable directory, I/O error) raises :class:`LandingError` with
one line naming the path and the cause, and leaves no temporary file behind when it can remove it.

Each file also carries, in its Parquet key-value metadata, the collector's record of the QoS 2 messages
landed but perhaps not yet released by the broker (``tern.qos2``: packet id + checksum of topic and
payload, see :func:`qos2_key`). It is committed by the same rename as the rows, so after a crash the
newest file says which resends (DUP set, same packet id, same checksum) are already on disk:
:meth:`LandingWriter.last_record` reads it back.

The columns and their order are the landing and quarantine tables of :mod:`.schema`.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import re
import struct

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


# Parquet key-value metadata of every landing and quarantine file
META_COLLECTOR = b"tern.collector"  # the exact --id (file names only hold a file-safe form of it)
META_COMMIT = b"tern.commit"        # the commit (batch) this file belongs to: its smallest recv_idx
META_PART = b"tern.part"            # 1, 2, ...: the order the commit's files were renamed in
META_QOS2 = b"tern.qos2"            # base64 of (packet id: 2 bytes, qos2_key: 8 bytes) entries
_ENTRY = struct.Struct(">H8s")


def qos2_key(topic: str, payload: bytes) -> bytes:
    """8-byte checksum of a message's topic and payload: with the packet id and the DUP flag, what
    tells a resend of a landed QoS 2 message from a new message that reuses the packet id."""
    return hashlib.blake2b(topic.encode() + b"\0" + bytes(payload), digest_size=8).digest()


def reading_key(topic: str, device: str, boot: int, seq: int) -> bytes:
    """8-byte checksum of what a reading is (its topic, device, boot and sequence number): a copy
    with the same key is the same reading, whatever packet id or DUP flag it came with (a broker that
    lost its state after delivering it, or a device that published it again because it never got the
    PUBCOMP). The collector keeps a window of the QoS 2 keys it landed (see :mod:`.collect`)."""
    return hashlib.blake2b(f"{topic}\0{device}\0{boot}\0{seq}".encode(), digest_size=8).digest()


def encode_record(record: dict) -> bytes:
    return base64.b64encode(b"".join(_ENTRY.pack(pid, key) for pid, key in record.items()))


def decode_record(text: bytes) -> dict:
    raw = base64.b64decode(text, validate=True)
    if len(raw) % _ENTRY.size:
        raise ValueError("truncated record")
    return {pid: key for pid, key in _ENTRY.iter_unpack(raw)}


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
        self.collector = collector
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

    def _hour_dirs(self):
        for top in (self.root, os.path.join(self.root, schema.QUARANTINE_DIR)):
            for date in _subdirs(top, "date="):
                yield from _subdirs(date, "hour=")

    def remove_stale_temps(self) -> int:
        """Delete temporary files this collector left when it was killed mid-write; returns how many."""
        prefix = f"{TMP_PREFIX}{self.tag}-"
        n = 0
        for hour in self._hour_dirs():
            for entry in os.scandir(hour):
                if entry.name.startswith(prefix):
                    _unlink_quietly(entry.path)
                    n += 1
        return n

    def last_record(self) -> dict:
        """The QoS 2 record (``{packet id: qos2_key}``) of this collector's newest commit: the
        messages it landed that the broker may not have released yet. Empty when there is none.

        Every commit's rows arrived after the previous commit's, and file names carry the first
        ``recv_idx``, so the newest commit's files are the top of this collector's files by name; of
        those, the one renamed last (highest ``tern.part``) holds the record of everything that
        commit made durable (a kill mid-commit leaves parts 1..k, and part k's record covers exactly
        what they hold). Only footers are read."""
        names = []
        rx = re.compile(rf"^(?:part|q)-{re.escape(self.tag)}-(\d{{20}})\.parquet$")
        for hour in self._hour_dirs():
            for entry in os.scandir(hour):
                m = rx.match(entry.name)
                if m:
                    names.append((int(m.group(1)), entry.path))
        names.sort(reverse=True)
        commit, best, part = None, {}, 0
        for _, path in names:
            try:
                meta = pq.read_metadata(path).metadata or {}
            except (OSError, pa.ArrowException) as e:
                raise LandingError(getattr(e, "errno", None) or errno.EIO,
                                   f"cannot read landing file {path}: {e}") from None
            if meta.get(META_COLLECTOR) != self.collector.encode():
                if META_COLLECTOR in meta:
                    continue  # another collector whose id maps to the same file-name tag
                break  # written before files carried a record: nothing to go on
            if commit is None:
                commit = meta.get(META_COMMIT)
            elif meta.get(META_COMMIT) != commit:
                break
            p = int(meta.get(META_PART, b"0"))
            if p > part:
                try:
                    best, part = decode_record(meta.get(META_QOS2, b"")), p
                except ValueError as e:
                    raise LandingError(errno.EINVAL, f"landing file {path} has a damaged "
                                       f"{META_QOS2.decode()} record: {e}") from None
        return best

    def recent_qos2(self, limit: int) -> list:
        """Identity keys of the newest ``limit`` QoS 2 messages this collector landed, oldest first:
        :func:`reading_key` of each QoS 2 landing row and :func:`qos2_key` of each quarantined row
        (quarantine files keep the raw payload but no QoS: a malformed QoS 0/1 payload in the window
        only matters if the same bytes come again at QoS 2). Newest files first, by name (the first
        ``recv_idx``), until ``limit`` keys are found; only the identity columns are read."""
        rx = re.compile(rf"^(part|q)-{re.escape(self.tag)}-(\d{{20}})\.parquet$")
        names = []
        for hour in self._hour_dirs():
            for entry in os.scandir(hour):
                m = rx.match(entry.name)
                if m:
                    names.append((int(m.group(2)), m.group(1), entry.path))
        names.sort(reverse=True)
        chunks: list = []
        found = 0
        for _, kind, path in names:
            if found >= limit:
                break
            try:
                meta = pq.read_metadata(path).metadata or {}
                if meta.get(META_COLLECTOR, self.collector.encode()) != self.collector.encode():
                    continue  # another collector whose id maps to the same file-name tag
                if kind == "part":
                    t = pq.read_table(path, columns=["topic", "device", "boot", "seq", "qos"])
                    c = t.to_pydict()
                    keys = [reading_key(tp, d, b, sq) for tp, d, b, sq, q in
                            zip(c["topic"], c["device"], c["boot"], c["seq"], c["qos"]) if q == 2]
                else:
                    c = pq.read_table(path, columns=["topic", "payload_raw"]).to_pydict()
                    keys = [qos2_key(tp, raw) for tp, raw in zip(c["topic"], c["payload_raw"])]
            except (OSError, pa.ArrowException) as e:
                raise LandingError(getattr(e, "errno", None) or errno.EIO,
                                   f"cannot read landing file {path}: {e}") from None
            chunks.append(keys)
            found += len(keys)
        out = [k for keys in reversed(chunks) for k in keys]
        return out[-limit:] if limit else []

    # --- commit -------------------------------------------------------------------------------

    def _write_file(self, directory: str, name: str, table: pa.Table, meta: dict) -> None:
        """Write ``table`` (and ``meta`` as the file's key-value metadata) under a temporary name,
        fsync, rename to ``name``, fsync the directory."""
        self._ensure_dir(directory)
        final = os.path.join(directory, name)
        tmp = os.path.join(directory, f"{TMP_PREFIX}{self.tag}-{name}")
        try:
            with open(tmp, "xb") as f:
                _write_parquet(f, table, meta)
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

    def commit(self, rows: dict, quarantine: dict, record: dict | None = None) -> dict:
        """Make a batch durable. ``rows`` and ``quarantine`` are column lists (``{name: [values]}``,
        every landing/quarantine column present, ``recv_ts`` and ``_idx`` included; ``_q2`` optional:
        ``(packet id, qos2_key)`` for a QoS 2 message, else None). ``record`` is the QoS 2 record of
        earlier commits still to carry. Returns the record after this commit.

        Each file carries the record of what is durable once it is renamed: ``record`` plus the
        QoS 2 entries of this file and of the commit's files renamed before it, never those of a
        file not yet written (a crash before that file must let its messages land again)."""
        rec = dict(record or {})
        todo = []
        for cols, arrow, prefix, base in (
                (rows, LANDING_ARROW, "part", self.root),
                (quarantine, QUARANTINE_ARROW, "q", os.path.join(self.root, schema.QUARANTINE_DIR))):
            if not cols["recv_ts"]:
                continue
            for (date, hour), idx in _by_partition(cols["recv_ts"]).items():
                part = {k: [v[i] for i in idx] for k, v in cols.items()} if len(idx) < len(
                    cols["recv_ts"]) else cols
                todo.append((arrow, prefix, base, date, hour, part))
        if not todo:
            return rec
        commit_id = str(min(p["_idx"][0] for *_, p in todo)).encode()
        for n, (arrow, prefix, base, date, hour, part) in enumerate(todo, 1):
            for entry in part.get("_q2") or ():
                if entry is not None:
                    rec[entry[0]] = entry[1]
            table = pa.Table.from_pydict({c: part[c] for c in arrow.names}, schema=arrow)
            meta = {META_COLLECTOR: self.collector.encode(), META_COMMIT: commit_id,
                    META_PART: str(n).encode(), META_QOS2: encode_record(rec)}
            first = part["_idx"][0]
            self._write_file(os.path.join(base, f"date={date}", f"hour={hour}"),
                             f"{prefix}-{self.tag}-{first:020d}.parquet", table, meta)
        return rec


def _write_parquet(f, table: pa.Table, meta: dict) -> None:
    """One Parquet file with ``meta`` in its footer's key-value metadata -- added to the file only:
    as Arrow schema metadata it would be stored twice (the footer also holds the serialized Arrow
    schema), which doubles the record's size."""
    if not hasattr(pq.ParquetWriter, "add_key_value_metadata"):
        raise LandingError(errno.ENOTSUP, "pyarrow too old: ParquetWriter.add_key_value_metadata is "
                           f"missing (pyarrow {pa.__version__}); install a newer pyarrow")
    with pq.ParquetWriter(f, table.schema) as w:
        w.write_table(table)
        w.add_key_value_metadata(meta)


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
