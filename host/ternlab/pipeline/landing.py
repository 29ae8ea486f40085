"""Durable landing files: the collector's only way to put rows on disk.

A batch becomes one Parquet file per ``date=/hour=`` partition (and per quarantine partition), each
committed atomically: written in the collector's own temporary directory, flushed and fsync'd, renamed
into its partition, and the partition directory fsync'd so the rename itself survives a power cut.
:meth:`LandingWriter.commit` returns only when every file of the batch is durable; the collector
acknowledges nothing before that. Any failure (disk full, read-only or unwritable directory, I/O
error) raises :class:`LandingError` with one line naming the path and the cause, and how many of the
batch's rows were already in files renamed before it.

Each collector owns one directory, ``<root>/.tern/<tag>/`` (:func:`collector_tag`: its exact id,
escaped; Spark and Hadoop skip names starting with ``.``): ``tmp/`` for files being written, ``lock``
(held while it runs: a second process with the same id on the same landing is refused) and
``qos2-window`` (:class:`WindowLog`). A start removes what ``tmp/`` holds -- files no other collector
can have written -- and nothing anywhere else.

Each file also carries, in its Parquet key-value metadata, the collector's record of the QoS 2 messages
landed but perhaps not yet released by the broker (``tern.qos2``: packet id + identity, see
:mod:`.qos2`). It is committed by the same rename as the rows, so after a crash the newest commit says
which resends (DUP set, same packet id, same identity) are already on disk:
:meth:`LandingWriter.last_record` reads it back.

The columns and their order are the landing and quarantine tables of :mod:`.schema`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import struct
import zlib

import pyarrow as pa
import pyarrow.parquet as pq

from . import qos2, schema

_ARROW = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64(),
          "binary": pa.binary(), "map<string,double>": pa.map_(pa.string(), pa.float64())}


def arrow_schema(columns) -> pa.Schema:
    """The Arrow schema of a :mod:`.schema` table (same names, types and nullability)."""
    return pa.schema([pa.field(n, _ARROW[t], nullable) for n, t, nullable in columns])


LANDING_ARROW = arrow_schema(schema.LANDING_COLUMNS)
QUARANTINE_ARROW = arrow_schema(schema.QUARANTINE_COLUMNS)
STATE_DIR = ".tern"  # <root>/.tern/<collector tag>/: each collector's own files


# Parquet key-value metadata of every landing and quarantine file
META_COLLECTOR = b"tern.collector"  # the exact --id
META_COMMIT = b"tern.commit"        # the commit (batch) this file belongs to: its smallest recv_idx
META_PART = b"tern.part"            # 1, 2, ...: the order the commit's files were renamed in
META_QOS2 = b"tern.qos2"            # the QoS 2 record: qos2.encode_record


class LandingError(OSError):
    """A landing file could not be made durable; the message is one line with the path and cause
    (``errno`` keeps the system's error number). ``written``: rows of the failed commit already in
    files renamed before the failure (on disk, not acknowledged), ``landed`` the landing rows of them
    (the rest were quarantine rows)."""

    written = landed = 0

    def __str__(self) -> str:
        return self.strerror or super().__str__()


_PLAIN = re.compile(r"[A-Za-z0-9._-]")
MAX_TAG = 100


def collector_tag(collector: str) -> str:
    """A collector id as file names carry it, exactly: ``A-Z a-z 0-9 . _ -`` as they are (a leading
    ``.`` excepted), every other byte of its UTF-8 as ``~XX``, so ``a/b`` is ``a~2Fb`` and ``a_b``
    stays ``a_b``. A tag longer than 100 characters (ids of more than 33 bytes outside that set, or
    100 inside it) is its first 60 characters, ``~~`` and 32 hex digits of the id's BLAKE2b-128: the
    exact id is in every file's footer (``tern.collector``)."""
    out = []
    for i, ch in enumerate(collector):
        if _PLAIN.match(ch) and not (i == 0 and ch == "."):
            out.append(ch)
        else:
            out.extend(f"~{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
    tag = "".join(out)
    if len(tag) > MAX_TAG:
        digest = hashlib.blake2b(collector.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
        tag = tag[:60] + "~~" + digest
    return tag


def legacy_tag(collector: str) -> str:
    """The file-name form of collector ids before :func:`collector_tag` (lossy: ``a/b`` and ``a_b``
    shared it); only read, to find a collector's own older files, which their footer confirms."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", collector) or "_"


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


class WindowLog:
    """The identities of the QoS 2 messages a collector landed (:mod:`.qos2`'s window), oldest first,
    as an append-only file -- what makes a restart cost the same after a day or a year.

    One block per commit (an empty one for a commit without QoS 2 readings: the last block says which
    commit the log has reached), appended after the commit's files are renamed: ``TQW1``, the commit
    id (8 bytes), the number of keys (4 bytes), the keys, a CRC-32 of the block. Appends are not
    fsync'd: the landing files are the truth, and the commits a power cut took from the log (the few
    seconds the page cache held) or a torn block (its CRC fails and ends the read) are read from
    their files instead (:meth:`LandingWriter.window_keys`). :meth:`rewrite` replaces the file with
    one block (temporary file, fsync, rename, directory fsync): at every start, and whenever the file
    holds more than twice the window or ``MAX_BLOCKS`` blocks, so it never grows past that."""

    MAGIC = b"TQW1"
    MAX_BLOCKS = 4096  # blocks (commits) before a rewrite, however few keys: a start parses at most these
    _HEAD = struct.Struct(">4sQI")

    def __init__(self, path: str, limit: int):
        self.path = path
        self.limit = limit
        self.keys_in_file = 0
        self.blocks = 0

    def read(self):
        """``(last commit id, the newest ``limit`` keys)``, or None when there is no log."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        keys: list = []
        last = 0
        pos, head, k = 0, self._HEAD, qos2.KEY_BYTES
        self.blocks = 0
        while pos + head.size + 4 <= len(data):
            magic, commit, n = head.unpack_from(data, pos)
            end = pos + head.size + n * k
            if magic != self.MAGIC or end + 4 > len(data) or \
                    zlib.crc32(data[pos:end]) != struct.unpack_from(">I", data, end)[0]:
                break
            keys.extend(data[i:i + k] for i in range(pos + head.size, end, k))
            last = commit
            pos = end + 4
            self.blocks += 1
        self.keys_in_file = len(keys)
        return last, keys[-self.limit:]

    def _block(self, commit: int, keys) -> bytes:
        b = self._HEAD.pack(self.MAGIC, commit, len(keys)) + b"".join(keys)
        return b + struct.pack(">I", zlib.crc32(b))

    def rewrite(self, commit: int, keys) -> None:
        keys = list(keys)[-self.limit:]
        tmp = self.path + ".new"
        with open(tmp, "wb") as f:
            f.write(self._block(commit, keys))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, self.path)
        fsync_dir(os.path.dirname(self.path))
        self.keys_in_file = len(keys)
        self.blocks = 1

    def append(self, commit: int, keys) -> None:
        self.blocks += 1
        if self.keys_in_file + len(keys) > 2 * self.limit or self.blocks > self.MAX_BLOCKS:
            got = self.read()
            self.rewrite(commit, (got[1] if got else []) + list(keys))
            return
        with open(self.path, "ab") as f:
            f.write(self._block(commit, keys))
        self.keys_in_file += len(keys)


class LandingWriter:
    """Writes a collector's batches under ``root``.

    File names: ``part-<tag>-<first recv_idx>.parquet`` (landing) and ``q-...`` (quarantine), ``tag``
    from :func:`collector_tag`; ``recv_idx`` is unique per collector and never repeats across its
    restarts (see the collector), so names never collide and a rename never replaces another file.
    ``window``: how many QoS 2 identities :meth:`window_keys` gives back.
    """

    def __init__(self, root: str, collector: str, window: int = 65536):
        self.root = os.path.abspath(root)
        self.collector = collector
        self.tag = collector_tag(collector)
        self.state = os.path.join(self.root, STATE_DIR, self.tag)
        self.tmp = os.path.join(self.state, "tmp")
        self.log = WindowLog(os.path.join(self.state, "qos2-window"), window)
        self._lock = None
        self._known_dirs: set[str] = set()
        tags = {re.escape(self.tag), re.escape(legacy_tag(collector))}
        self._own = re.compile(rf"^(part|q)-(?:{'|'.join(sorted(tags))})-(\d{{20}})\.parquet$")
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
        """Fail now, with a clear error, if ``root`` cannot take durable files (before connecting),
        or if another process with this collector id runs on this landing (its lock is held until
        this process ends)."""
        import fcntl

        self._ensure_dir(self.root)
        probe = os.path.join(self.tmp, "probe")
        try:
            for d in (os.path.dirname(self.state), self.state, self.tmp):
                if not os.path.isdir(d):
                    os.mkdir(d)
                    fsync_dir(os.path.dirname(d))
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
        lock = os.path.join(self.state, "lock")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise LandingError(e.errno, f"cannot open {lock}: {_why(e)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise LandingError(errno.EBUSY, f"another collector with --id {self.collector!r} is "
                               f"running on {self.root} (it holds {lock})") from None
        self._lock = fd  # held until the process ends

    def close(self) -> None:
        """Let go of the lock :meth:`check` took (the process's end does it too)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def remove_stale_temps(self) -> int:
        """Delete the files this collector was writing when it was killed (its own ``tmp/``, which
        no other collector writes to); returns how many."""
        n = 0
        try:
            entries = list(os.scandir(self.tmp))
        except FileNotFoundError:
            return 0
        for entry in entries:
            _unlink_quietly(entry.path)
            n += 1
        return n

    def own_files(self):
        """``(first recv_idx, "part" | "q", path)`` of this collector's files, newest first: the
        partitions newest first (landing and quarantine together), so a caller that stops early
        lists only the newest hours, whatever the landing's age (a directory of dates is the only
        thing listed in full)."""
        trees = (self.root, os.path.join(self.root, schema.QUARANTINE_DIR))
        for date in sorted({d for t in trees for d in _subdirs(t, "date=")}, reverse=True):
            for hour in sorted({h for t in trees for h in _subdirs(os.path.join(t, date), "hour=")},
                               reverse=True):
                found = []
                for t in trees:
                    d = os.path.join(t, date, hour)
                    try:
                        entries = list(os.scandir(d))
                    except (FileNotFoundError, NotADirectoryError):
                        continue
                    for entry in entries:
                        m = self._own.match(entry.name)
                        if m:
                            found.append((int(m.group(2)), m.group(1), entry.path))
                yield from sorted(found, reverse=True)

    def _footer(self, path: str) -> dict | None:
        """A file's key-value metadata; None when another collector wrote it (an id that shares the
        legacy tag, or the long-id digest)."""
        try:
            meta = pq.read_metadata(path).metadata or {}
        except (OSError, pa.ArrowException) as e:
            raise LandingError(getattr(e, "errno", None) or errno.EIO,
                               f"cannot read landing file {path}: {e}") from None
        if meta.get(META_COLLECTOR, self.collector.encode()) != self.collector.encode():
            return None
        return meta

    def last_record(self) -> dict:
        """The QoS 2 record (``{packet id: identity}``) of this collector's newest commit: the
        messages it landed that the broker may not have released yet. Empty when there is none.

        Every commit's rows arrived after the previous commit's, and file names carry the first
        ``recv_idx``, so the newest commit's files are the first of :meth:`own_files`; of those, the
        one renamed last (highest ``tern.part``) holds the record of everything that commit made
        durable (a kill mid-commit leaves parts 1..k, and part k's record covers exactly what they
        hold). Only footers are read."""
        commit, best, part = None, {}, 0
        for _, _, path in self.own_files():
            meta = self._footer(path)
            if meta is None:
                continue
            if META_COLLECTOR not in meta:
                break  # written before files carried a record: nothing to go on
            if commit is None:
                commit = meta.get(META_COMMIT)
            elif meta.get(META_COMMIT) != commit:
                break
            p = int(meta.get(META_PART, b"0"))
            if p > part:
                try:
                    best, part = qos2.decode_record(meta.get(META_QOS2, b"")), p
                except ValueError as e:
                    raise LandingError(errno.EINVAL, f"landing file {path} has a damaged "
                                       f"{META_QOS2.decode()} record: {e}") from None
        return best

    def window_keys(self) -> list:
        """The identities of the newest ``window`` QoS 2 messages this collector landed, oldest
        first (the messages :func:`.qos2.in_window` takes), and the log rewritten to hold them.

        From the log, plus the landing files of commits newer than its last block (a crash between a
        commit's rename and its log block; never more than one commit unless appends failed): a
        bounded read. Without a log (a new collector, or a landing written before collectors kept
        one) from the landing files, newest first, until the window is full -- once: the log is
        written then."""
        got = self.log.read()
        after, keys = (None, []) if got is None else got
        newest = after or 0
        chunks = []
        found = 0
        for _, kind, path in self.own_files():
            if after is None and found >= self.log.limit:
                break
            meta = self._footer(path)
            if meta is None:
                continue
            commit = int(meta.get(META_COMMIT, b"0") or 0)
            if after is not None and commit <= after:
                break
            newest = max(newest, commit)
            if kind == "part":
                chunk = _window_keys_of(path)
                chunks.append(chunk)
                found += len(chunk)
        keys = keys + [k for chunk in reversed(chunks) for k in chunk]
        keys = keys[-self.log.limit:]
        try:
            self._ensure_dir(self.state)
            self.log.rewrite(newest, keys)
        except OSError as e:
            raise LandingError(e.errno, f"cannot write {self.log.path}: {_why(e)}") from None
        return keys

    # --- commit -------------------------------------------------------------------------------

    def _write_file(self, directory: str, name: str, table: pa.Table, meta: dict) -> None:
        """Write ``table`` (and ``meta`` as the file's key-value metadata) in the temporary
        directory, fsync, rename it to ``directory/name``, fsync the directory."""
        self._ensure_dir(directory)
        self._ensure_dir(self.tmp)
        final = os.path.join(directory, name)
        tmp = os.path.join(self.tmp, name)
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
        every landing/quarantine column present, ``recv_ts`` and ``_idx`` included; optional:
        ``_q2``, ``(packet id, identity)`` of a message delivered at QoS 2, else None; ``_win``, a
        landing row's window identity, else None). ``record`` is the QoS 2 record of earlier commits
        still to carry. Returns the record after this commit.

        Every file's table is built before the first is written: a value the Parquet writer refuses
        raises (not an OSError) with nothing on disk. Each file carries the record of what is durable
        once it is renamed: ``record`` plus the QoS 2 entries of this file and of the commit's files
        renamed before it, never those of a file not yet written (a crash before that file must let
        its messages land again). Last, the commit's window identities are appended to the log."""
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
                table = pa.Table.from_pydict({c: part[c] for c in arrow.names}, schema=arrow)
                todo.append((prefix, base, date, hour, part, table))
        if not todo:
            return rec
        commit_id = min(p["_idx"][0] for *_, p, _ in todo)
        written = landed = 0
        for n, (prefix, base, date, hour, part, table) in enumerate(todo, 1):
            for entry in part.get("_q2") or ():
                if entry is not None:
                    rec[entry[0]] = entry[1]
            meta = {META_COLLECTOR: self.collector.encode(), META_COMMIT: str(commit_id).encode(),
                    META_PART: str(n).encode(), META_QOS2: qos2.encode_record(rec)}
            first = part["_idx"][0]
            try:
                self._write_file(os.path.join(base, f"date={date}", f"hour={hour}"),
                                 f"{prefix}-{self.tag}-{first:020d}.parquet", table, meta)
            except LandingError as e:
                e.written, e.landed = written, landed
                raise
            written += len(part["recv_ts"])
            landed += len(part["recv_ts"]) if prefix == "part" else 0
        keys = [k for prefix, *_, part, _ in todo if prefix == "part" for k in part.get("_win") or () if k]
        try:
            self.log.append(commit_id, keys)
        except OSError as e:
            err = LandingError(e.errno, f"cannot write {self.log.path}: {_why(e)}")
            err.written, err.landed = written, landed
            raise err from None
        return rec


def unwritable_rows(cols: dict, arrow: pa.Schema) -> dict:
    """``{row index: why}`` of the rows of ``cols`` that the Parquet writer refuses on their own."""
    bad = {}
    for i in range(len(cols["recv_ts"])):
        try:
            pa.Table.from_pydict({c: [cols[c][i]] for c in arrow.names}, schema=arrow)
        except Exception as e:  # whatever pyarrow raises for a value it cannot take
            bad[i] = f"{type(e).__name__}: {e}"
    return bad


def _window_keys_of(path: str) -> list:
    """The window identities of a landing file's rows (:func:`.qos2.in_window`), in file order."""
    try:
        c = pq.read_table(path, columns=["device", "boot", "qos", "seq"]).to_pydict()
    except (OSError, pa.ArrowException) as e:
        raise LandingError(getattr(e, "errno", None) or errno.EIO,
                           f"cannot read landing file {path}: {e}") from None
    return [qos2.message_key(d, b, q, s) for d, b, q, s in zip(c["device"], c["boot"], c["qos"], c["seq"])
            if q == 2]


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


def _subdirs(path: str, prefix: str) -> list:
    """Names of the directories in ``path`` starting with ``prefix``."""
    try:
        return [e.name for e in os.scandir(path) if e.name.startswith(prefix) and e.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
