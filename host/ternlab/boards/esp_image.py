"""What kind of ESP32 image a file is, so `tern flash` writes it where it belongs.

Three kinds reach users:

- a combined image (micropython.org's downloads): the second-stage bootloader, then the partition
  table (at 0x8000 in flash), then the app (at 0x10000), laid out as the flash is from the chip's
  bootloader offset (0x1000 on ESP32, 0x0 on S3 and C3); it starts with the image magic 0xE9;
- a full-flash image, laid out from flash address 0: what `esptool merge-bin` writes by default
  (its target offset is 0, so an ESP32 image starts with 0x1000 bytes of 0xFF before the
  bootloader), with `--pad-to-size` filled with 0xFF to the flash's size, or a flash dump
  (`esptool read-flash 0 ALL`) that also holds the partitions after the app (the filesystem);
  on S3 and C3, whose bootloader is at 0x0, it is a combined image that goes on past the app;
- an app-only image (`build-<BOARD>/micropython.bin`): the app alone, which goes in the app
  partition; its first segment starts with the app description, magic 0xABCD5432 at offset 0x20
  (the 24-byte image header and the 8-byte segment header come before it).

A bootloader image has no app description; a combined or full one is told by the partition table at
0x8000 and an app image at 0x10000 of the flash, counted from where the file starts. The
bootloader's header's chip id (offset 12) says which chip the image was built for. Offsets and chip
ids are esptool's own.
"""

import struct

IMAGE_MAGIC = 0xE9
APP_DESC_MAGIC = 0xABCD5432
APP_DESC_AT = 0x20
TABLE_MAGIC = b"\xaa\x50"


class ImageError(ValueError):
    """The file is not an image `tern flash` can place; the message says what it is not."""


def chip_def(chip):
    """esptool's definition of a chip (BOOTLOADER_FLASH_OFFSET, IMAGE_CHIP_ID, CHIP_NAME)."""
    from esptool.targets import CHIP_DEFS

    try:
        return CHIP_DEFS[chip]
    except KeyError:
        raise ImageError("unknown chip %r (esptool knows: %s)" % (chip, ", ".join(sorted(CHIP_DEFS)))) from None


def _is_app(data, at=0):
    return (len(data) >= at + APP_DESC_AT + 4 and data[at] == IMAGE_MAGIC
            and struct.unpack_from("<I", data, at + APP_DESC_AT)[0] == APP_DESC_MAGIC)


def _chip_id(data, at=0):
    return struct.unpack_from("<H", data, at + 12)[0] if len(data) >= at + 14 else None


def classify(data, chip, name="image", table_offset=0x8000, app_offset=0x10000):
    """(kind, base, app_at) for the image bytes `data` built for `chip` (an esptool chip name):
    kind "app" (base None: it goes in the app partition, app_at 0), "combined" (base: the chip's
    bootloader offset) or "full" (base 0: a full-flash image); base is the flash address of the
    file's first byte, app_at where the app starts within it. ImageError says why it is none of
    them, or is for another chip."""
    cd = chip_def(chip)
    if not data:
        raise ImageError("%s is empty" % name)
    boot = cd.BOOTLOADER_FLASH_OFFSET
    if _is_app(data):
        kind, base, head = "app", None, 0
    else:
        for base in (boot, 0) if boot else (0,):  # where the file starts in flash
            head = boot - base  # the bootloader within the file
            if (len(data) > head and data[head] == IMAGE_MAGIC and data[table_offset - base:table_offset - base + 2]
                    == TABLE_MAGIC and _is_app(data, app_offset - base)):
                kind = "combined" if base == boot else "full"
                break
        else:
            _refuse(data, cd, name, table_offset, app_offset)
    got = _chip_id(data, head)
    if got != cd.IMAGE_CHIP_ID:
        from esptool.targets import CHIP_DEFS

        other = [c.CHIP_NAME for c in CHIP_DEFS.values() if c.IMAGE_CHIP_ID == got]
        raise ImageError("%s is built for %s, not %s (image chip id %s)"
                         % (name, other[0] if other else "another chip", cd.CHIP_NAME, got))
    return kind, base, 0 if base is None else app_offset - base


def _refuse(data, cd, name, table_offset, app_offset):
    # Why data is neither an app, a combined nor a full-flash image: ImageError.
    boot = cd.BOOTLOADER_FLASH_OFFSET
    if data[0] != IMAGE_MAGIC:
        full = ", or 0xff up to a bootloader at 0x%x for a full-flash image" % boot if boot else ""
        raise ImageError("%s is not an ESP32 image (first byte %02x, expected 0xe9%s)" % (name, data[0], full))
    if len(data) <= table_offset - boot:
        raise ImageError("%s is a bootloader alone (no app description at 0x%x, %d bytes): flash a combined image "
                         "or the app image (build-<BOARD>/micropython.bin)" % (name, APP_DESC_AT, len(data)))
    raise ImageError("%s is neither an app image (no app description magic 0x%08x at 0x%x) nor a combined "
                     "image for %s (no partition table at 0x%x and app at 0x%x of the file, for the bootloader "
                     "at 0x%x)" % (name, APP_DESC_MAGIC, APP_DESC_AT, cd.CHIP_NAME, table_offset - boot,
                                    app_offset - boot, boot))
