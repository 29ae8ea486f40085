"""Which partition table `tern flash` writes, judged against the table the board already holds.

Tern's tables (boards/<profile>/partitions.csv) take the outbox partition from the start of
MicroPython's filesystem: on ESP32_GENERIC stock MicroPython has `vfs` at 0x200000 (2 MiB), Tern
`outbox` there (128 KiB) and `vfs` at 0x220000. Written over a stock table, the new `vfs` starts
128 KiB into the old one: the user's files are unreadable, and MicroPython formats the partition
afresh at its next boot. So the board's table is read first and, when the new one would move or
resize its `vfs`, `tern flash` says so and offers layouts that keep the files:

- "tern": the profile's table (the default);
- "keep-vfs": the board's own table with the outbox taken from the end of its app partition, so
  `vfs` stays where it is (the app must still fit the smaller app partition);
- "board": the board's table as it is: no outbox partition, so the telemetry app keeps its outbox
  in files on `vfs` (FileStore).
"""

from .partitions import MAX_LEN, TABLE_OFFSET, TYPES, PartitionError, from_binary, to_binary

LAYOUTS = ("tern", "keep-vfs", "board")
VFS = "vfs"


def board_table(data):
    """The partitions of a board's table, from the 0xC00 bytes at 0x8000 (or a whole flash dump);
    [] for an erased table (a new or erased chip: nothing to keep). PartitionError when they are
    neither a table nor erased."""
    if len(data) > TABLE_OFFSET:
        data = data[TABLE_OFFSET:TABLE_OFFSET + MAX_LEN]
    if data[:32] == b"\xff" * 32:
        return []
    return from_binary(data)


def _find(parts, name):
    return next((p for p in parts if p["name"] == name), None)


def _kib(n):
    return "%d KiB" % (n >> 10)


def describe(p):
    return "%s at 0x%x (%s)" % (p["name"], p["offset"], _kib(p["size"]))


def changes(old, new):
    """What writing table `new` over `old` changes, one phrase per partition."""
    out = []
    for p in new:
        q = _find(old, p["name"])
        if q is None:
            out.append("adds " + describe(p))
        elif (q["offset"], q["size"]) != (p["offset"], p["size"]):
            moved = "moves" if q["offset"] != p["offset"] else "resizes"
            out.append("%s %s from 0x%x (%s) to 0x%x (%s)" % (moved, p["name"], q["offset"], _kib(q["size"]),
                                                            p["offset"], _kib(p["size"])))
    out += ["drops " + describe(q) for q in old if _find(new, q["name"]) is None]
    return out


def keep_vfs(parts, outbox, app_len):
    """The board's table `parts` with the outbox partition `outbox` (its entry in Tern's table) taken
    from the end of the first app partition; ValueError when the app (app_len bytes) would not fit."""
    if _find(parts, outbox["name"]):
        return [dict(p) for p in parts]  # it has one already (a Tern table with vfs where it was)
    app = next((p for p in parts if p["type"] == TYPES["app"]), None)
    if app is None:
        raise ValueError("the board's partition table has no app partition")
    size = -(-outbox["size"] // 0x10000) * 0x10000  # an app partition ends on a 64 KiB boundary
    left = app["size"] - size
    if left < app_len:
        raise ValueError("--layout keep-vfs: the %s partition would shrink to %s, and the app is %s: it does not fit"
                         % (app["name"], _kib(left), _kib(app_len)))
    out = []
    for p in parts:
        p = dict(p)
        out.append(p)
        if p["name"] == app["name"]:
            p["size"] = left
            out.append(dict(outbox, offset=p["offset"] + left, size=size, flags=0))
    to_binary(out)  # fits one table
    return out


def choose(layout, tern_parts, board_parts, outbox_name, app_len, port="PORT"):
    """(partitions to write, notes, warning) for --layout `layout`: board_parts is the board's table
    ([] erased, None unknown). warning: what the write would destroy, for the user to confirm (with
    the mpremote commands that would save the files from the board on `port`)."""
    notes = []
    if layout != "tern" and not board_parts:
        raise ValueError("--layout %s builds on the board's partition table, and the board has %s" % (
            layout, "none (an erased chip)" if board_parts == [] else "not been read (--dry-run: give it with "
            "--board-table FILE, from esptool read-flash 0x8000 0xc00 FILE)"))
    if layout == "board":
        parts = [dict(p) for p in board_parts]
        if not _find(parts, outbox_name):
            notes.append("--layout board: the board's partition table is kept; it has no %s partition, so the "
                         "telemetry app keeps its outbox in files on vfs (FileStore)" % outbox_name)
        return parts, notes, None
    if layout == "keep-vfs":
        if not _find(board_parts, VFS):
            raise ValueError("--layout keep-vfs: the board's partition table has no vfs partition to keep")
        parts = keep_vfs(board_parts, _find(tern_parts, outbox_name), app_len)
        notes.append("--layout keep-vfs: the board's table with %s; vfs stays at 0x%x: the files on it are kept"
                     % (describe(_find(parts, outbox_name)), _find(parts, VFS)["offset"]))
        return parts, notes, None
    parts = tern_parts
    if board_parts is None:
        return parts, notes, None
    if not board_parts:
        notes.append("the board's partition table is erased: nothing on it to keep")
        return parts, notes, None
    old, new = _find(board_parts, VFS), _find(parts, VFS)
    said = changes(board_parts, parts)
    if said:
        notes.append("the board's partition table differs from Tern's: it " + "; ".join(said))
    if old is None or (old["offset"], old["size"]) == (new["offset"], new["size"]):
        return parts, notes, None
    warning = ("writing Tern's table moves vfs (MicroPython's filesystem) from 0x%x (%s) to 0x%x (%s): the files "
               "on the board become unreadable, and MicroPython formats the new vfs at its next boot. To keep "
               "them: --layout keep-vfs (the outbox taken from the end of the app partition, vfs where it is), "
               "or --layout board (the board's table as it is, the outbox in files on vfs), or copy them off "
               "first (mpremote connect %s cp -r :/ ./board-files/) and back after its first boot (mpremote "
               "connect %s cp -r ./board-files/. :). --yes writes Tern's table anyway"
               % (old["offset"], _kib(old["size"]), new["offset"], _kib(new["size"]), port, port))
    return parts, notes, warning


__all__ = ["LAYOUTS", "PartitionError", "board_table", "changes", "choose", "describe", "keep_vfs"]
