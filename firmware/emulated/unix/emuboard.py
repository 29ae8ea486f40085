"""The emulated board's device side: what the unix port needs to boot like a board.

The host (ternlab.boards.emulated) starts

    micropython -X heapsize=H -i -c "import gc;gc.collect();b=gc.mem_alloc();__import__('time');gc.collect();import emuboard;emuboard.boot(globals(),b);del emuboard,b"

with TERN_EMU_CONFIG naming a JSON file: {"profile": {...}, "id": "...",
"image": path, "cut_at": N, "seed": S, "mode": "friendly"|"raw", "reserve": R,
"cut_file": path, "link": path, "host_paths": [...], "romfs": path}. (`time` first: this folder's
time.py, whose sleep_ms() waits in one system call where the port's wakes every 0.5 ms; imported and
its compiler's garbage collected before emuboard, so it does not split the heap a ROMFS buffer needs.)
boot() then does what a board's firmware does before its REPL:

- opens ONE emulated NOR flash image (norflash.NorFlash semantics, read and
  written through the file, no RAM copy: the image may be larger than the
  board's heap) and splits it into the LittleFS region (first `fs_blocks`
  blocks) and the raw outbox partition (the blocks after it);
- mounts the LittleFS region at "/" in place of the host's filesystem
  (formatting it on first boot, as boards do), so files are reached with
  the same paths as on a board, and puts "/lib" on sys.path;
- with a ROMFS image (profile `romfs`): reads it into one buffer first (the
  unix port has vfs.VfsRom but no ROM partition: the buffer stands in for
  memory-mapped flash and is paid from the reserve), mounts it at "/rom" and
  puts "/rom" and "/rom/lib" ahead of "/lib", as ROMFS firmware does; .mpy
  files there run in place;
- for a profile with "network": "wifi", makes network.WLAN the emulated
  station of network.py, whose link is the byte the host writes in the
  "link" file (the host cuts and restores the board's Wi-Fi with it);
- hides the emulator's own heap use: the process gets `reserve` bytes more
  than the profile's heap and keeps what the emulator did not use as ballast,
  so gc.mem_free() at the REPL is about what the board would have;
- runs boot.py, then main.py (friendly REPL only, as boards do: a soft reset
  in raw REPL mode runs boot.py only), then hands over to the REPL.

Ctrl-C and the filesystem. This unix port raises KeyboardInterrupt from its SIGINT handler at once,
wherever the process is (MICROPY_ASYNC_KBD_INTR), so a Ctrl-C that lands inside LittleFS's C code
unwinds through it and leaves its RAM state torn: a file written next can vanish (it did: the app's
main.py, written by the host right after mpremote's Ctrl-C met a fresh board's boot). A board's Ctrl-C
never lands inside its flash driver. So Ctrl-C is held (micropython.kbd_intr(-1): no SIGINT handler;
the host's relay then waits while the process is not at a prompt) during every block-device call, and
during the boot's own file work (finding and compiling boot.py and main.py, see _run). LittleFS's own C
code between block-device calls is still exposed to a Ctrl-C from user code's file calls (the port
gives no hook there); it is a small share of the time, as the block device is Python.

A power cut kills the process with SIGKILL at once (no finally, no flush):
at the N-th flash operation (the torn write is on the image first) or from
the host at any time. reset() is machine.reset(): the process is killed
with SIGUSR1 and the host boots it again.

The watchdog and deep sleep are machine.WDT and machine.deepsleep with the
host as the hardware: WDT(timeout=ms) and feed() print sentinels
("\x00TERN:WDT:ms\x00", "\x00TERN:F\x00") that the host's relay strips from
the console and times, and the relay kills and reboots the process when a
feed is late, whatever the app is doing (a busy loop, a blocking call, a
stopped process). Nothing here can stop the dog once started: it keeps
running across a soft reboot and ends only with the process (a reset, a
power cut, deep sleep). deepsleep(ms) prints "\x00TERN:SLEEP:ms\x00" and
kills the process with SIGUSR2: RAM is lost, and the host boots it again
after ms. reset_cause() is what the host says started this process (config
"cause"), with the ESP32 port's constants.
"""

import gc
import json
import os
import sys

import vfs
from micropython import kbd_intr
from time import ticks_ms, ticks_diff, sleep_ms
from norflash import NorFlash, PowerCut

PROFILE = None
flash = None
_id = b""
_parts = {}
_cut_file = None
_ballast = None
_rom = None  # the ROMFS partition's bytes: stands in for memory-mapped flash (in the reserve)
_CHUNK = 256

# machine.reset_cause() values, as the ESP32 port numbers them
PWRON_RESET = 1
HARD_RESET = 2
WDT_RESET = 3
DEEPSLEEP_RESET = 4
SOFT_RESET = 5
_CAUSES = {"pwron": PWRON_RESET, "hard": HARD_RESET, "wdt": WDT_RESET, "deepsleep": DEEPSLEEP_RESET, "soft": SOFT_RESET}
_cause = PWRON_RESET


def _kill(sig):
    # The shell's parent is this process: SIGKILL ends it at once, with no
    # exception unwinding through the application's finally blocks.
    os.system("kill -%s $PPID" % sig)


class Flash(NorFlash):
    """NorFlash on the image file with no RAM mirror (same rules, counters,
    wear file and torn writes); dying means SIGKILL, not an exception."""

    _CHUNK = _CHUNK  # the torn writes work through _chunk/_put in pieces this big

    def __init__(self, path, blocks, block_size, cut_at=0, seed=1):
        self._setup(path, blocks, block_size, cut_at, seed)
        self.arm_base = 0  # ops when the cut was armed (arm_cut)
        self._s = bytearray(_CHUNK)
        self._sv = memoryview(self._s)
        if os.stat(path)[6] != self.size:
            raise ValueError("%s: image is not %d bytes" % (path, self.size))
        self._f = open(path, "r+b")
        self._load_wear()

    # -- the storage primitives, on the file (the NOR rules are NorFlash's) --
    def _chunk(self, pos, k):
        f = self._f
        f.seek(pos)
        v = self._sv if k == _CHUNK else self._sv[:k]
        f.readinto(v)
        return v

    def _put(self, pos, v):
        self._f.seek(pos)
        self._f.write(v)

    def _read(self, pos, buf, n):
        self._f.seek(pos)
        self._f.readinto(buf)

    def _check_program(self, pos, buf, n):
        s = self._s
        i = 0
        f = self._f
        while i < n:
            k = min(_CHUNK, n - i)
            f.seek(pos + i)
            f.readinto(s, k)  # not _chunk: no slice, so no allocation (a GC finaliser may close a file here)
            for j in range(k):
                if s[j] & buf[i + j] != buf[i + j]:
                    self._violation(pos + i + j, s[j], buf[i + j])
            i += k

    def _store_program(self, pos, buf, n):
        self._put(pos, buf)
        self._persist_counts()

    def _store_erase(self, block, pos):
        s = self._s
        for j in range(_CHUNK):
            s[j] = 0xFF
        for i in range(0, self.block_size, _CHUNK):
            self._put(pos + i, self._sv)
        self._persist_erase(block)

    def _die(self):
        self.dead = True
        if _cut_file is not None:
            _cut_file.write(json.dumps({"op": self.ops, "nth": self.ops - self.arm_base, "torn": self.torn}))
            _cut_file.close()
        _kill("KILL")
        raise PowerCut("power cut at flash operation %d" % self.ops)  # only if kill failed


_held = 0  # depth of _hold(): a flash operation inside the boot's file work nests


def _hold():
    global _held
    kbd_intr(-1)  # first: Ctrl-C held for a flash operation or the boot's file work (module docstring)
    _held += 1


def _release():
    # the last call before a return: from here Ctrl-C may land, outside the held work only
    global _held
    _held -= 1
    if not _held:
        kbd_intr(3)


class Partition:
    """A run of blocks of the flash, as its own block device (extended protocol). Each call holds
    Ctrl-C from its first bytecode to its last: _release() is the last call before the return."""

    def __init__(self, dev, label, start, blocks):
        self.dev = dev
        self.label = label
        self.start = start
        self.blocks = blocks

    def _check(self, block, offset, n):
        end = block * self.dev.block_size + offset + n
        if block < 0 or offset < 0 or end > self.blocks * self.dev.block_size:
            raise ValueError("%s: block %d offset %d length %d is outside the partition" % (self.label, block, offset, n))

    def readblocks(self, block, buf, offset=0):
        _hold()
        try:
            self._check(block, offset, len(buf))
            r = self.dev.readblocks(self.start + block, buf, offset)
        except BaseException:  # noqa: B036 - Ctrl-C back on, whatever failed
            _release()
            raise
        _release()
        return r

    def writeblocks(self, block, buf, offset=0):
        _hold()
        try:
            self._check(block, offset, len(buf))
            r = self.dev.writeblocks(self.start + block, buf, offset)
        except BaseException:  # noqa: B036
            _release()
            raise
        _release()
        return r

    def ioctl(self, op, arg=0):
        _hold()
        try:
            r = self._ioctl(op, arg)
        except BaseException:  # noqa: B036
            _release()
            raise
        _release()
        return r

    def _ioctl(self, op, arg):
        if op == 4:
            return self.blocks
        if op == 6:
            self._check(arg, 0, 0)
            return self.dev.ioctl(6, self.start + arg)
        return self.dev.ioctl(op, arg)


def partition(label):
    """The raw partition `label` (e.g. "outbox"), or None if the board has none."""
    return _parts.get(label)


def unique_id():
    """Stable per board, like machine.unique_id(): from the id the host gave."""
    return _id


def reset():
    """machine.reset(): the process restarts and the board boots again."""
    _kill("USR1")


def _tell(word):
    # A sentinel for the host's relay, which takes it out of the console.
    sys.stdout.write("\x00TERN:" + word + "\x00")


def reset_cause():
    """machine.reset_cause(): why this boot happened (PWRON_RESET, HARD_RESET,
    WDT_RESET, DEEPSLEEP_RESET, SOFT_RESET), as the host started it."""
    return _cause


class WDT:
    """machine.WDT(id=0, timeout=ms): once made, the host resets the board when
    feed() is not called for `timeout` ms. It has no deinit: it cannot be stopped."""

    def __init__(self, id=0, timeout=5000):
        if id != 0:
            raise ValueError("WDT(%d) doesn't exist" % id)
        if not isinstance(timeout, int) or timeout <= 0:
            raise ValueError("WDT timeout must be a positive number of ms")
        self._t = ticks_ms()
        _tell("WDT:%d" % timeout)  # starts (or re-times) the dog on the host, fed now

    def feed(self):
        # At most one sentinel per 10 ms: a tight loop of feeds does not flood
        # the console; the host may then bite up to 10 ms early.
        t = ticks_ms()
        if ticks_diff(t, self._t) >= 10:
            self._t = t
            _tell("F")


def deepsleep(ms=None):
    """machine.deepsleep(ms): the process ends here (RAM is lost) and the host
    boots the board again after ms with reset_cause() DEEPSLEEP_RESET;
    without ms it sleeps until the host power-cycles it."""
    _tell("SLEEP:%d" % (-1 if ms is None else max(0, ms)))
    _kill("USR2")
    while True:  # only if the kill failed
        sleep_ms(100)


def arm_cut(n, seed=None):
    """Cut the power at the n-th flash operation from now (1 = the next)."""
    flash.arm_base = flash.ops
    flash.cut_at = flash.ops + n
    if seed is not None:
        flash._rng = ((seed * 2654435761) & 0xFFFFFFFF) or 1
        for _ in range(8):
            flash._rand()


def _run(name, g):
    _hold()  # finding, reading and compiling the file: LittleFS at work (see the module docstring)
    try:
        with open(name) as f:
            code = compile(f.read(), name, "exec")
    except OSError as e:
        _release()
        if e.errno != 2:  # ENOENT: no such file, nothing to run; anything else a board would print
            sys.print_exception(e)
        return
    except BaseException as e:  # noqa: B036 - a SyntaxError, say: printed as a board prints it
        _release()
        sys.print_exception(e)
        return
    _release()
    try:
        exec(code, g)
    except SystemExit:
        pass
    except BaseException as e:  # noqa: B036 - a board prints it (Ctrl-C too) and goes on to the REPL
        sys.print_exception(e)


def boot(g, base):
    """base: gc.mem_alloc() before this module was loaded (the interpreter's own use)."""
    global PROFILE, flash, _id, _cut_file, _ballast, _rom, _cause
    with open(os.getenv("TERN_EMU_CONFIG")) as f:
        cfg = json.load(f)
    _cause = _CAUSES.get(cfg.get("cause"), PWRON_RESET)
    rom = cfg.get("romfs")
    if rom:  # first, in one piece at the start of the heap, so it does not split what the board gets
        _rom = bytearray(os.stat(rom)[6])
        with open(rom, "rb") as f:
            f.readinto(_rom)
    PROFILE = cfg["profile"]
    _id = cfg["id"].encode()
    fl = PROFILE["flash"]
    fs_blocks = fl["fs_blocks"]
    ob = fl.get("outbox")
    total = fs_blocks + (ob["blocks"] if ob else 0)
    flash = Flash(cfg["image"], total, fl["block_size"], cfg.get("cut_at") or 0, cfg.get("seed") or 1)
    if cfg.get("cut_file"):
        _cut_file = open(cfg["cut_file"], "w")
    import machine  # this folder's machine.py (a board's reset() & co over the port's own): imported now, it stays
    if PROFILE.get("network") == "wifi" and cfg.get("link"):
        import network  # from the shim's folder, still on sys.path: imported now, it stays

        network._link = open(cfg["link"], "rb")
    fs = Partition(flash, "vfs", 0, fs_blocks)
    if ob:
        _parts[ob["label"]] = Partition(flash, ob["label"], fs_blocks, ob["blocks"])
    mode = cfg.get("mode", "friendly")
    host_paths = cfg.get("host_paths") or ()
    reserve = cfg.get("reserve") or 0
    cfg = f = None
    try:
        lfs = vfs.VfsLfs2(fs)
    except OSError:  # first boot: an erased flash, as boards format it
        vfs.VfsLfs2.mkfs(fs)
        lfs = vfs.VfsLfs2(fs)
    vfs.umount("/")
    vfs.mount(lfs, "/")
    os.chdir("/")
    sys.path[:] = ["", ".frozen", "/lib"]
    if rom:  # as a board with a ROMFS partition: mounted at /rom, /rom and /rom/lib searched first
        vfs.mount(vfs.VfsRom(_rom), "/rom")
        sys.path[2:2] = ["/rom", "/rom/lib"]
    for i, p in enumerate(host_paths):
        mp = "/host%d" % i
        vfs.mount(vfs.VfsPosix(p), mp)
        sys.path.append(mp)
    gc.collect()
    spare = reserve - (gc.mem_alloc() - base)
    if spare > 64:  # in pieces: one block this size may not fit a small heap
        _ballast = []
        while spare > 1100:
            _ballast.append(bytearray(1024))
            spare -= 1040
    elif reserve:
        print("emuboard: the emulator uses %d bytes more than its reserve" % -spare)
    gc.collect()
    # From here on the host may send Ctrl-C: a KeyboardInterrupt stops the
    # step it lands in (boot.py, main.py: printed by _run), never the boot.
    step = 0
    while step < 3:
        step += 1
        try:
            if step == 1:
                sys.stdout.write("\x00TERN:UP\x00")  # the host may talk to the board from now on
            elif step == 2:
                _run("boot.py", g)
            elif mode == "raw":
                sys.stdout.write("\x00TERN:RAW\x00")  # the host swallows the banner and enters the raw REPL
            else:
                _run("main.py", g)
        except KeyboardInterrupt:
            pass
