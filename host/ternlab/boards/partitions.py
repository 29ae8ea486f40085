"""ESP32 partition tables: the CSV a profile ships, checked, and the binary the bootloader reads.

Binary format (ESP-IDF "Partition Tables", flashed at 0x8000): one 32-byte
entry per partition -- magic AA 50, type (u8), subtype (u8), offset (u32 LE),
size (u32 LE), label (16 bytes, NUL padded), flags (u32 LE) -- then an MD5
entry (EB EB, 14 x FF, the MD5 of all the entries before it), then 0xFF up to
0xC00 bytes. Written from the documented layout; checked by the tests byte by
byte.
"""

import hashlib
import struct

TABLE_OFFSET = 0x8000
MAX_LEN = 0xC00
ENTRY = struct.Struct("<2sBBII16sI")
MAGIC = b"\xaa\x50"
MD5_MAGIC = b"\xeb\xeb" + b"\xff" * 14

TYPES = {"app": 0x00, "data": 0x01}
SUBTYPES = {
    "app": {"factory": 0x00, "test": 0x20, **{"ota_%d" % i: 0x10 + i for i in range(16)}},
    "data": {"ota": 0x00, "phy": 0x01, "nvs": 0x02, "coredump": 0x03, "nvs_keys": 0x04,
             "efuse": 0x05, "undefined": 0x06, "esphttpd": 0x80, "fat": 0x81, "spiffs": 0x82,
             "littlefs": 0x83},
}
FLASH_SIZES = {"%dMB" % n: n << 20 for n in (1, 2, 4, 8, 16, 32)}


class PartitionError(ValueError):
    """The table is wrong; the message names the line and what is wrong with it."""


def _num(text, where):
    t = text.strip().upper()
    mult = 1
    if t.endswith("K"):
        t, mult = t[:-1], 1024
    elif t.endswith("M"):
        t, mult = t[:-1], 1024 * 1024
    try:
        return int(t, 0) * mult
    except ValueError:
        raise PartitionError("%s: %r is not a number" % (where, text)) from None


def parse_csv(text, name="partitions.csv", flash_size=None):
    """[{"name","type","subtype","offset","size","flags"}] from the CSV text,
    checked: known types, alignment (apps 64 KiB, data 4 KiB), no overlap,
    nothing before 0x9000 or past the flash."""
    parts = []
    end_prev = TABLE_OFFSET + 0x1000
    for no, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        where = "%s line %d" % (name, no)
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 5:
            raise PartitionError("%s: expected Name, Type, SubType, Offset, Size[, Flags]" % where)
        label, ptype, sub, off, size = cols[:5]
        flags = cols[5] if len(cols) > 5 else ""
        if not label or len(label.encode()) > 15:
            raise PartitionError("%s: the name must be 1 to 15 bytes" % where)
        if ptype not in TYPES:
            raise PartitionError("%s: unknown type %r (app or data)" % (where, ptype))
        subtype = SUBTYPES[ptype].get(sub)
        if subtype is None:
            subtype = _num(sub, where) if sub[:1].isdigit() else None
            if subtype is None or not 0 <= subtype <= 0xFE:
                raise PartitionError("%s: unknown %s subtype %r" % (where, ptype, sub))
        offset = _num(off, where) if off else end_prev
        align = 0x10000 if ptype == "app" else 0x1000
        if offset % align:
            raise PartitionError("%s: offset 0x%x of %s is not aligned to 0x%x" % (where, offset, label, align))
        length = _num(size, where)
        if length <= 0 or length % 0x1000:
            raise PartitionError("%s: size 0x%x of %s is not a positive multiple of 4 KiB" % (where, length, label))
        if offset < end_prev:
            raise PartitionError("%s: %s at 0x%x overlaps what comes before (ends at 0x%x)" % (where, label, offset, end_prev))
        if flash_size and offset + length > flash_size:
            raise PartitionError("%s: %s ends at 0x%x, past the end of the %d MiB flash" % (where, label, offset + length, flash_size >> 20))
        if label in (p["name"] for p in parts):
            raise PartitionError("%s: %s is named twice" % (where, label))
        if flags not in ("", "encrypted"):
            raise PartitionError("%s: unknown flag %r" % (where, flags))
        parts.append({"name": label, "type": TYPES[ptype], "subtype": subtype, "offset": offset,
                      "size": length, "flags": 1 if flags == "encrypted" else 0})
        end_prev = offset + length
    if not parts:
        raise PartitionError("%s: no partitions" % name)
    return parts


def to_binary(parts):
    """The 0xC00-byte table the ESP32 bootloader reads."""
    body = b"".join(ENTRY.pack(MAGIC, p["type"], p["subtype"], p["offset"], p["size"],
                               p["name"].encode(), p["flags"]) for p in parts)
    body += MD5_MAGIC + hashlib.md5(body).digest()
    if len(body) > MAX_LEN:
        raise PartitionError("too many partitions for one table")
    return body + b"\xff" * (MAX_LEN - len(body))


def from_binary(data):
    """Entries back from a binary table (checks the MD5); the inverse of to_binary."""
    parts = []
    for i in range(0, MAX_LEN, ENTRY.size):
        chunk = data[i:i + ENTRY.size]
        if chunk[:2] == MAGIC:
            magic, t, st, off, size, label, flags = ENTRY.unpack(chunk)
            parts.append({"name": label.rstrip(b"\0").decode(), "type": t, "subtype": st, "offset": off,
                          "size": size, "flags": flags})
        elif chunk[:16] == MD5_MAGIC:
            if chunk[16:] != hashlib.md5(data[:i]).digest():
                raise PartitionError("partition table MD5 does not match")
            return parts
        else:
            break
    raise PartitionError("partition table has no MD5 entry")


def profile_table(profile):
    """(entries, binary) of a profile's partitions.csv, checked against the profile:
    an outbox data partition of the profile's size, a "vfs" filesystem."""
    from pathlib import Path

    if not profile.get("partitions"):
        raise PartitionError("profile %s has no partition table" % profile["name"])
    path = Path(profile["_dir"]) / profile["partitions"]
    size = FLASH_SIZES.get(profile.get("flash_size", ""))
    parts = parse_csv(path.read_text(), str(path), size)
    ob = profile["flash"].get("outbox")
    if ob:
        got = [p for p in parts if p["name"] == ob["label"]]
        if not got or got[0]["type"] != TYPES["data"]:
            raise PartitionError("%s: no data partition named %r (the profile's outbox)" % (path, ob["label"]))
        want = ob["blocks"] * profile["flash"]["block_size"]
        if got[0]["size"] != want:
            raise PartitionError("%s: %s is 0x%x bytes, the profile says 0x%x" % (path, ob["label"], got[0]["size"], want))
    if not any(p["name"] == "vfs" for p in parts):
        raise PartitionError("%s: no 'vfs' partition for MicroPython's filesystem" % path)
    return parts, to_binary(parts)
