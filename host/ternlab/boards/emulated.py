"""EmulatedBoard: the MicroPython unix port behaving like a board on a serial port.

Two pseudo-terminals per board. The *port* (`board.port`, /dev/pts/N) is what
mpremote, pyserial or a terminal opens, exactly like a board's USB serial
device; it stays the same across resets and power cycles. Behind it, a
relay (the "supervisor", ternlab.boards.emulated_pty; every board's on one event loop,
ternlab.boards.hub) runs the device
process -- the unix port, started through the `emuboard` boot shim (device
side: firmware/emulated/unix/emuboard.py) -- on a second pty; that module says what
the relay does (line endings, Ctrl-C, soft reboot and hard reset, the
watchdog, deep sleep, reset causes, power cuts). This one is the Board: power,
freeze/thaw, cuts, the flash image and the ROMFS partition.

The flash image (`flash.img` + `flash.img.wear` counters), the console log and
the boot config live in the board's workdir.
"""

import json
import os
import random
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from .board import Board, BoardError, load_profile
from .console import ConsoleLog
from ..paths import use_device
from .emulated_pty import Supervisor, micropython_path
from .spawn import FolderInUse, FolderLock

__all__ = ["EmulatedBoard", "RESERVE", "create_image", "micropython_path", "port_id"]
RESERVE = 48 * 1024  # heap for the emulator itself (flash, partitions, VFS); hidden from the app


def port_id(exe: str | None = None) -> str:
    """'64-bit, MicroPython 1.28.0': a unix port build's pointer size (a board's is 32) and version."""
    out = subprocess.run([exe or micropython_path(), "-c", "import sys; print('%d-bit, MicroPython %s' % "
                          "(64 if sys.maxsize > 1 << 32 else 32, '.'.join(str(n) for n in sys.implementation.version[:3])))"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _norflash():
    use_device("norflash")
    import norflash

    return norflash


def create_image(path, blocks, block_size):
    """An erased flash image and its zeroed wear counters (host side)."""
    _norflash().NorFlash(str(path), blocks=blocks, block_size=block_size, fresh=True).close()




class EmulatedBoard(Board):
    """A board made of the MicroPython unix port, a pty and an emulated NOR flash.

    EmulatedBoard(profile="unix-emulated", workdir=None, board_id=None,
                  host_paths=(), echo=None, power=True, cut_at=0, seed=1)

    Besides power: `freeze()`/`thaw()` (the app hangs: fault injection),
    `reset_cause` (why it last booted), `asleep` (in emulated deep sleep).

    workdir holds flash.img (+ .wear counters), console.log, board.json,
    cut.json and id (the board's id, kept across runs as a chip's); a new temporary directory if None (removed by close() only if
    it was made here). host_paths: host folders mounted read-write at
    /host0, /host1, ... and put on sys.path (the board does not have them:
    use only for code under test that is not deployed to its flash).
    """

    def __init__(self, profile="unix-emulated", workdir=None, board_id=None, host_paths=(), echo=None,
                 power=True, cut_at=0, seed=1, reserve=RESERVE):
        prof = profile if isinstance(profile, dict) else load_profile(profile)
        if not prof.get("emulated"):
            raise ValueError("profile %r is a real board's: give its serial port (tern deploy/repl --port PORT, "
                             "pytest --board-port PORT; SerialBoard in Python)" % prof["name"])
        if prof.get("kind") == "qemu" and type(self) is EmulatedBoard:
            raise ValueError("profile %r is a qemu board's: it runs under QEMU (QemuBoard in Python; tern board "
                             "run --profile %s and pytest --board-profile %s choose it)" % (prof["name"], prof["name"], prof["name"]))
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="tern-board-")).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:  # one board per flash image: two would corrupt it
            self._folder = FolderLock(self.workdir)
        except FolderInUse as e:
            raise BoardError("the board in %s is in use: its flash is held by %s; use its port instead, or stop "
                             "that process" % (self.workdir, e)) from None
        self.id = self._identity(prof["name"], board_id)
        self.image = self.workdir / "flash.img"
        self.host_paths = [Path(p).resolve() for p in host_paths]
        self.reserve = reserve
        fl = prof["flash"]
        self.fs_blocks = fl["fs_blocks"]
        self.outbox_blocks = fl["outbox"]["blocks"] if fl.get("outbox") else 0
        blocks = self.fs_blocks + self.outbox_blocks
        if not self.image.exists() or self.image.stat().st_size != blocks * fl["block_size"]:
            create_image(self.image, blocks, fl["block_size"])
        self.link_file = self.workdir / "link"
        self.link_file.write_bytes(b"1")  # Wi-Fi (profile "network": "wifi") up at power-on
        super().__init__(prof, ConsoleLog(str(self.workdir / "console.log"), echo))
        self._boot_args = (0, 1)
        self._sup = self._supervisor()
        self._sup.start()
        if power:
            self.power_on(cut_at=cut_at, seed=seed)

    def _identity(self, name, board_id):
        """The board's id (emuboard.unique_id(), the firmware's default client id): kept in the folder's
        `id` file, as a chip's is burnt in, so every run of the same folder is the same device; drawn
        once at random (PROFILE-<8 hex>) for a new folder; board_id sets it (and is kept)."""
        f = self.workdir / "id"
        try:
            kept = f.read_text().strip()
        except FileNotFoundError:
            kept = ""
        bid = board_id or kept or "%s-%s" % (name, uuid.uuid4().hex[:8])
        if bid != kept:
            f.write_text(bid + "\n")
        return bid

    def _supervisor(self):
        """The thread that runs the device and relays its port (QemuBoard runs QEMU instead)."""
        return Supervisor(self)

    # -- Board ---------------------------------------------------------------
    @property
    def port(self):
        """The board's serial port (a pty path): what mpremote connects to."""
        return self._sup.port

    def _port_path(self):
        return self._sup.port

    def _alive(self):
        return self._sup.state in ("booting", "on")

    def _raw(self):
        if self._sup.state == "off":
            raise BoardError("%s is powered off" % self.id)
        if self._sup.state == "asleep":
            raise BoardError("%s is in deep sleep (it wakes by itself; power_cycle() wakes it now)" % self.id)
        return super()._raw()

    @property
    def is_on(self):
        """Powered: running, booting or in deep sleep (it wakes by itself). Read under the relay's
        lock: a reboot the relay does (a power cycle, the watchdog) passes through "off" inside it."""
        if self._sup.state != "off":
            return True
        with self._sup.lock:
            return self._sup.state != "off"

    @property
    def asleep(self):
        """In deep sleep: no process, the port is silent, a wake-up is due (or a power cycle)."""
        return self._sup.state == "asleep"

    @property
    def reset_cause(self):
        """Why the board last booted, as emuboard.reset_cause() tells the device: "pwron" (power on or
        power cycle), "hard" (machine.reset), "soft" (soft reboot), "wdt" (the watchdog bit),
        "deepsleep" (woke from deep sleep)."""
        return self._sup.cause

    def freeze(self):
        """Fault injection: the app hangs. The device process is stopped (SIGSTOP) wherever it is, so
        it prints nothing, feeds nothing and answers nothing, as a board stuck in a busy loop or a
        blocking call; only the watchdog (if the app started one), a power cycle or thaw() end it."""
        with self._sup.lock:
            if not self._sup.freeze(True):
                raise BoardError("%s is not running" % self.id)
            self.log.event("frozen (fault injection: the app hangs)")

    def thaw(self):
        """Resume a frozen board where it stopped (a stall shorter than the watchdog)."""
        with self._sup.lock:
            if self._sup.frozen and self._sup.freeze(False):
                self.log.event("thawed")

    @property
    def link_up(self):
        """Whether the board's Wi-Fi link is up (see set_link)."""
        return self.link_file.read_bytes()[:1] != b"0"

    def set_link(self, up):
        """Fault injection for a profile with "network": "wifi": the access point goes away (False)
        or comes back (True). The app sees network.WLAN().isconnected() change at its next look;
        connections already open are not touched (on a board they die with the link: the caller
        closes them, see ternlab.fleet.custody). Lasts across reboots, as an access point's outage."""
        with open(self.link_file, "r+b") as f:  # in place: a read never finds the file empty
            f.write(b"1" if up else b"0")
        self.log.event("Wi-Fi link " + ("up" if up else "down"))

    @property
    def pid(self):
        p = self._sup.proc
        return p.pid if p is not None else None

    def _next_boot(self):
        a, self._boot_args = self._boot_args, (0, 1)
        return a

    def _reset_transport(self):
        if self._t is not None:
            self._t.in_raw_repl = False
            self._t.use_raw_paste = True
        self._busy = False

    # -- power -----------------------------------------------------------------
    def power_on(self, cut_at=0, seed=1, timeout=10.0, app=True, wait=True):
        """Boot the board (boot.py, then main.py). cut_at=N: the power fails at the
        N-th flash program/erase counted from power-on (seeded torn write). app=False:
        boot.py only, then the raw REPL, as a soft reset in raw mode (main.py does not run:
        what `tern deploy` boots a board with). wait=False: return at once (wait_booted()
        then: a fleet powers its boards on together)."""
        with self._lock:
            with self._sup.lock:
                if self._sup.state != "off":
                    raise BoardError("%s is already on%s" % (self.id, " (in deep sleep)" if self.asleep else ""))
                self._reset_transport()
                self.log.event("power on" + (" (cut at flash operation %d, seed %d)" % (cut_at, seed) if cut_at else "")
                               + ("" if app else " (main.py not run)"))
                self._sup.spawn("friendly" if app else "raw", cut_at, seed)
        if wait:
            self._wait_booted(timeout)

    @property
    def booted(self):
        """After power_on(wait=False) or power_cycle(wait=False): True once the firmware is up,
        False if it failed to boot (or lost power first), None while it boots."""
        if self._sup.booted.is_set():
            return True
        return False if (self._sup.off.is_set() or self._sup.boot_failed.is_set()) else None

    def wait_booted(self, timeout=10.0):
        """Wait until the board's firmware is up (after power_on(wait=False)); BoardError if it
        failed to boot or did not in time."""
        self._wait_booted(timeout)

    def _wait_booted(self, timeout):
        end = time.monotonic() + timeout
        while not self._sup.booted.wait(0.05):
            if (self._sup.off.is_set() or self._sup.boot_failed.is_set()) and not self._sup.booted.is_set():
                time.sleep(0.05)
                raise BoardError("%s failed to boot: %s" % (self.id, " | ".join(self.log.texts(max(0, self.log.mark() - 6), kind=None))))
            if time.monotonic() > end:
                raise BoardError("%s did not boot within %.0f s" % (self.id, timeout))

    def power_off(self, timeout=5.0):
        """Cut the power now (SIGKILL); the board stays off."""
        with self._lock:
            if self._sup.kill("off"):
                self._wait_off(timeout)
            self._reset_transport()

    def power_cycle(self, cut_at=0, seed=1, timeout=10.0, wait=True):
        """Power off and on again: a hard reset (boot.py and main.py run). wait=False: return once
        the new boot is under way (see booted)."""
        with self._lock:
            with self._sup.lock:
                self._boot_args = (cut_at, seed)
                self._sup.booted.clear()
                self._sup.boot_failed.clear()  # an earlier boot's, until the new process is spawned
                killed = self._sup.kill("cycle")
            self._reset_transport()
            if not killed:
                self._boot_args = (0, 1)
                self.power_on(cut_at=cut_at, seed=seed, timeout=timeout, wait=wait)
                return
            if wait:
                self._wait_booted(timeout)

    def cut_power(self, after=0.0, seed=None):
        """Power cut from the host (SIGKILL) after `after` seconds, or after a
        seeded random time in [lo, hi) if `after` is a pair. Returns the delay."""
        if isinstance(after, (tuple, list)):
            delay = random.Random(seed).uniform(after[0], after[1])
        else:
            delay = float(after)
        with self._sup.lock:
            if self._sup.state == "off":
                raise BoardError("%s is powered off" % self.id)
            self._sup.cut_note = "from the host after %.3f s%s" % (delay, "" if seed is None else " (seed %s)" % seed)
            self._sup.cut_deadline = time.monotonic() + delay
            self._sup._wake()
        self._reset_transport()
        return delay

    def start(self):
        """Power on if off (what the pytest plugin calls after constructing)."""
        if not self.is_on:
            self.power_on()

    def stop(self):
        self.close()

    def arm_cut(self, n, seed=None):
        """From the running board: the power fails at its n-th flash operation from now."""
        self.exec("import emuboard\nemuboard.arm_cut(%d%s)" % (n, "" if seed is None else ", %d" % seed))

    def wait_off(self, timeout=10.0):
        """Wait until the board has lost power (a cut at op N, a timed cut)."""
        self._wait_off(timeout)
        self._reset_transport()

    def _wait_off(self, timeout):
        if not self._sup.off.wait(timeout):
            raise BoardError("%s is still on after %.1f s" % (self.id, timeout))

    def last_cut(self):
        """{"op": N, "torn": [...]} of the last power cut at a flash operation, else None."""
        try:
            return json.loads((self.workdir / "cut.json").read_text())
        except (FileNotFoundError, ValueError):
            return None

    # -- ROMFS -------------------------------------------------------------------
    @property
    def romfs_image(self):
        """The board's ROMFS partition (profile `romfs`), a file in its workdir."""
        return self.workdir / "romfs.img"

    def romfs_size(self):
        """Bytes of the ROMFS image deployed to the board (0: none, or no ROMFS partition)."""
        if not self.profile.get("romfs"):
            return 0
        try:
            return self.romfs_image.stat().st_size
        except FileNotFoundError:
            return 0

    def write_romfs(self, image):
        """Write a ROMFS image (mpremote's format) to the board's ROMFS partition, as `mpremote
        romfs deploy` does on a board; it is mounted at /rom from the next boot on."""
        rom = self.profile.get("romfs")
        if not rom:
            raise BoardError("profile %s has no ROMFS partition (profile key \"romfs\")" % self.name)
        image = bytes(image)
        if not image.startswith(b"\xd2\xcd\x31"):
            raise BoardError("not a ROMFS image (bad header %s)" % image[:3].hex())
        if len(image) > rom["bytes"]:
            raise BoardError("ROMFS image of %d bytes does not fit the %d-byte partition" % (len(image), rom["bytes"]))
        tmp = self.romfs_image.with_suffix(".tmp")
        tmp.write_bytes(image)
        os.replace(tmp, self.romfs_image)
        self.log.event("ROMFS image written (%d bytes)" % len(image))

    # -- flash -------------------------------------------------------------------
    def flash_counters(self):
        """Wear counters of the board's flash, read from the host (also while off):
        programs, bytes_programmed, erases (per block), erases_total, and per
        partition ("vfs", outbox label) the erases of its blocks."""
        w = _norflash().read_wear(str(self.image))
        e = w["erases"]
        parts = {"vfs": {"blocks": self.fs_blocks, "erases": sum(e[: self.fs_blocks])}}
        ob = self.profile["flash"].get("outbox")
        if ob:
            parts[ob["label"]] = {"blocks": self.outbox_blocks, "erases": sum(e[self.fs_blocks :])}
        w["partitions"] = parts
        return w

    def read_partition(self, label="outbox"):
        """The raw bytes of a flash partition, read from the image on the host."""
        bs = self.profile["flash"]["block_size"]
        data = self.image.read_bytes()
        if label == "vfs":
            return data[: self.fs_blocks * bs]
        ob = self.profile["flash"].get("outbox")
        if not ob or ob["label"] != label:
            raise ValueError("%s has no partition %r" % (self.name, label))
        return data[self.fs_blocks * bs :]

    def close(self):
        """Power off for good; idempotent."""
        with self._lock:
            self._drop()
        self._sup.stop()
        self.log.close()
        self._folder.close()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
