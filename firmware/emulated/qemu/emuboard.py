"""The qemu boards' device side, frozen into their firmware (MicroPython's qemu port on an Arm
Cortex-M3 or a RISC-V RV32 core): the board's own modules, as an ESP32 firmware has its _boot.py and
flashbdev.py, whether or not Tern is frozen in beside them. The same API as the unix-port board's
emuboard (firmware/emulated/unix/emuboard.py), so firmware/app/hal.py and the tests drive either unchanged.

The firmware runs `_boot.py` (which calls boot()) before boot.py and main.py. boot() reads the
host's board.json (semihosting: the host's board directory is QEMU's working directory), opens the
NOR flash (module `qboard`: native memory, written through to the host's flash.img), mounts its
LittleFS region at "/" (formatting an erased one, as boards do), keeps the raw outbox partition for
partition(), tells the host the sockets of any boot before are gone, and prints the "up" sentinel
the host waits for. sys.path is the firmware's own, as on an ESP32 or a Pico: ['', '.frozen',
'/lib'], with '/rom' and '/rom/lib' before '/lib' when the ROMFS partition holds an image (mounted
by MicroPython itself at every boot). PROFILE is read from board.json when first asked for, so the
board's heap does not hold it.

reset() is machine.reset(): QEMU exits with status 0 and the host boots the board again. A power
cut at the N-th flash operation (board.json "cut_at", or arm_cut()) ends QEMU with status 80
after the torn operation; the host reads cut.json.
"""

import sys
import vfs
import qboard

# machine.reset_cause() values, as the ESP32 port numbers them
PWRON_RESET = 1
HARD_RESET = 2
WDT_RESET = 3
DEEPSLEEP_RESET = 4
SOFT_RESET = 5

_id = b""
_cause = PWRON_RESET
_parts = {}


def _config():
    import json

    return json.loads(qboard.host_read("board.json"))


def __getattr__(name):
    if name == "PROFILE":
        return _config()["profile"]
    raise AttributeError(name)


def partition(label):
    """The raw partition `label` (e.g. "outbox"), or None if the board has none."""
    return _parts.get(label)


def unique_id():
    return _id


def reset():
    """machine.reset(): QEMU ends and the host boots the board again."""
    qboard.exit(0)


def reset_cause():
    return _cause


def arm_cut(n, seed=None):
    """Cut the power at the n-th flash operation from now (1 = the next)."""
    qboard.arm_cut(n, seed)


def uart():
    """The link UART: a stream to the host's TCP bridge (MQTT over a serial link)."""
    return qboard.UART()


def boot():
    global _id, _cause
    cfg = _config()
    prof = cfg["profile"]
    _id = cfg["id"].encode()
    fl = prof["flash"]
    n = fl["fs_blocks"]
    ob = fl.get("outbox")
    fresh = qboard.flash_open(n + (ob["blocks"] if ob else 0), fl["block_size"], cfg.get("cut_at") or 0,
                              cfg.get("seed") or 1)
    _cause = (PWRON_RESET if cfg.get("cause") != "hard" else HARD_RESET) if fresh else SOFT_RESET
    fs = qboard.Flash(0, n)
    if ob:
        _parts[ob["label"]] = qboard.Flash(n, ob["blocks"])
    if cfg.get("mode") == "raw":  # booted by the host to deploy: boot.py only, then the raw REPL
        qboard.raw_repl()
    cfg = prof = fl = ob = None
    qboard.net_reset()
    try:
        lfs = vfs.VfsLfs2(fs)
    except OSError:  # an erased flash: formatted on first boot, as boards do
        vfs.VfsLfs2.mkfs(fs)
        lfs = vfs.VfsLfs2(fs)
    vfs.mount(lfs, "/")
    import gc

    gc.collect()
    sys.stdout.write("\x00TERN:UP\x00")
