"""What kind of ESP32 image a file is, so `tern flash` writes it where it belongs.

Two kinds reach users, both starting with the image magic 0xE9:

- a combined image (micropython.org's downloads, `esptool merge-bin` output): the second-stage
  bootloader, then the partition table (at 0x8000 in flash), then the app (at 0x10000), laid out
  as the flash is from the chip's bootloader offset (0x1000 on ESP32, 0x0 on S3 and C3);
- an app-only image (`build-<BOARD>/micropython.bin`): the app alone, which goes in the app
  partition; its first segment starts with the app description, magic 0xABCD5432 at offset 0x20
  (the 24-byte image header and the 8-byte segment header come before it).

A bootloader image has no app description; a combined one is told by the partition table at
0x8000 - bootloader offset and an app image at 0x10000 - bootloader offset. The header's chip id
(offset 12) says which chip the image was built for. Offsets and chip ids are esptool's own.
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
    """("combined", app start within data) or ("app", 0) for the image bytes `data` built for
    `chip` (an esptool chip name); ImageError says why it is neither, or is for another chip."""
    cd = chip_def(chip)
    if not data:
        raise ImageError("%s is empty" % name)
    if data[0] != IMAGE_MAGIC:
        raise ImageError("%s is not an ESP32 image (first byte %02x, expected 0xe9)" % (name, data[0]))
    boot = cd.BOOTLOADER_FLASH_OFFSET
    if _is_app(data):
        kind, app_at = "app", 0
    elif data[table_offset - boot:table_offset - boot + 2] == TABLE_MAGIC and _is_app(data, app_offset - boot):
        kind, app_at = "combined", app_offset - boot
    elif len(data) <= table_offset - boot:
        raise ImageError("%s is a bootloader alone (no app description at 0x%x, %d bytes): flash a combined image "
                         "or the app image (build-<BOARD>/micropython.bin)" % (name, APP_DESC_AT, len(data)))
    else:
        raise ImageError("%s is neither an app image (no app description magic 0x%08x at 0x%x) nor a combined "
                         "image for %s (no partition table at 0x%x and app at 0x%x of the file, for the bootloader "
                         "at 0x%x)" % (name, APP_DESC_MAGIC, APP_DESC_AT, cd.CHIP_NAME, table_offset - boot,
                                        app_offset - boot, boot))
    got = _chip_id(data)
    if got != cd.IMAGE_CHIP_ID:
        from esptool.targets import CHIP_DEFS

        other = [c.CHIP_NAME for c in CHIP_DEFS.values() if c.IMAGE_CHIP_ID == got]
        raise ImageError("%s is built for %s, not %s (image chip id %s)"
                         % (name, other[0] if other else "another chip", cd.CHIP_NAME, got))
    return kind, app_at
