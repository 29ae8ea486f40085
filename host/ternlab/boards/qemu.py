"""QemuBoard: an emulated microcontroller -- MicroPython's own firmware (the `qemu` port) for an Arm
Cortex-M3 (MPS2-AN385, qemu-system-arm) or a RISC-V RV32 core (virt, qemu-system-riscv32: the
ESP32-C3's ISA), stock or with Tern frozen in as the profile says (ternlab.boards.firmware).

It is an EmulatedBoard (same Board interface, same power, cut and flash methods) whose device is
QEMU instead of the unix port:

- the firmware is `ternlab.boards.firmware.build(profile)` (built once per machine and kind); each boot gets
  the profile's heap and ROMFS partition size on the semihosting command line;
- UART0 is the REPL: QEMU's stdio, relayed by a thread to the board's pty (`board.port`, stable
  across power cycles), so mpremote speaks to it as to a board on USB serial; every line goes to
  the console log;
- the network UART carries the board's `socket` module to ternlab.boards.qemu_net, which dials what
  the app asks for on the host's loopback (`Client(server=..., port=...)` runs as on a board);
- the link UART is a serial line for `stream=` (MQTT over a modem in transparent mode): QEMU listens
  on a loopback TCP port (and waits for the bridge before the board starts, so nothing the board sends
  is lost), and a bridge thread connects it to `link(host, port)` (the broker, or a chaos proxy in
  front of it). Like a modem, the bridge dials when the board sends CONNECT and the far end is not
  connected, and when the far end hangs up (or cannot be reached) it says so on the carrier line (a
  modem's DCD): the firmware's link stream then reads end of stream, as a socket does when its peer
  closes; closing the stream on the board drops the line the other way (DTR) and the bridge hangs up;
- the NOR flash is the C model in the firmware (firmware/qemu-firmware/cmodules/qboard): native memory,
  written through to flash.img (+ .wear) in the board's workdir by semihosting, the torn write and
  cut.json at the N-th flash operation, after which QEMU exits with status 80 (power cut);
- machine.reset() (emuboard.reset()) ends QEMU with status 0: the relay boots it again;
- QEMU dies with the host process (ternlab.boards.spawn: a parent-death signal), and holds the
  board folder's lock while it lives.

On the Cortex-M3 the UARTs are the MPS2's own (UART1 link, UART2 carrier, UART3 network); `virt` has
one 16550 (the REPL), so the others are a pci-serial-4x's ports.

The board's workdir holds flash.img, board.json (what the firmware reads at boot: profile, id,
cut_at, seed, reset cause), cut.json, romfs.img, console.log and qemu.log (QEMU's own messages).
"""

import json
import os
import select
import shutil
import signal
import socket
import time

from .board import BoardError, device_profile, load_profile
from .emulated import EmulatedBoard
from .firmware import KIND as FIRMWARE_KIND, MACHINES, BuildError, build as build_firmware
from .qemu_net import NetBridge
from .relay import BACKLOG, BridgeLoop, PortRelay
from .spawn import popen

_UP = b"\x00TERN:UP\x00"
EXIT_POWER_CUT = 80  # firmware/qemu-firmware/cmodules/qboard/qboard.c


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _qemu_argv(b, link_port, dcd_port, net_port):
    """QEMU's command line for a board: its machine, the semihosting command line the firmware reads
    (heap=, romfs=), the REPL on stdio, the link, carrier and network UARTs as loopback TCP servers
    that wait for their bridges, and the profile's extra options (qemu_args)."""
    m = MACHINES[b.profile["arch"]]
    rom = (b.profile.get("romfs") or {}).get("bytes", 0)
    semi = "enable=on,target=native,arg=firmware,arg=heap=%d,arg=romfs=%d" % (b.profile["heap_bytes"], rom)
    argv = [shutil.which(m.qemu) or m.qemu, "-machine", m.machine, *m.run, "-nographic", "-monitor", "none",
            "-semihosting-config", semi, "-chardev", "stdio,id=repl,signal=off", "-serial", "chardev:repl"]
    for name, port in (("link", link_port), ("dcd", dcd_port), ("net", net_port)):
        argv += ["-chardev", "socket,id=%s,host=127.0.0.1,port=%d,server=on,wait=on,nodelay=on" % (name, port)]
    if m.pci_uarts:  # one 16550 on the machine (the REPL); the others on PCIe, slot 2 (qboard's hw.h)
        argv += ["-device", "pci-serial-4x,addr=2,chardev1=link,chardev2=dcd,chardev3=net"]
    else:  # the machine's own UARTs 1-3
        argv += ["-serial", "chardev:link", "-serial", "chardev:dcd", "-serial", "chardev:net"]
    return argv + ["-kernel", str(b.elf)] + b.qemu_args


class _Relay(PortRelay):
    """Runs QEMU and relays its REPL UART to the board's pty; what EmulatedBoard expects of its
    supervisor (spawn, kill, freeze, state, booted/boot_failed/off events, cut_deadline)."""

    def __init__(self, board):
        super().__init__(board, "qemuboard-%s" % board.id)
        self.q_in = self.q_out = None  # QEMU's stdin (we write) and stdout (we read)
        self.acc = b""
        self.link_port = None

    # -- QEMU ------------------------------------------------------------------------
    def spawn(self, mode="friendly", cut_at=0, seed=1, cause="pwron"):
        b = self.b
        cfg = {"profile": device_profile(b.profile), "id": b.id, "cause": cause, "cut_at": cut_at, "seed": seed,
               "mode": mode}
        try:
            os.remove(b.workdir / "cut.json")
        except FileNotFoundError:
            pass
        (b.workdir / "board.json").write_text(json.dumps(cfg))
        self.link_port, dcd_port, net_port = _free_port(), _free_port(), _free_port()
        argv = _qemu_argv(b, self.link_port, dcd_port, net_port)
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        with open(b.workdir / "qemu.log", "ab") as err:
            self.proc = popen(argv, stdin=in_r, stdout=out_w, stderr=err, cwd=str(b.workdir), close_fds=True,
                              pass_fds=(b._folder.fd(),), start_new_session=True)
        b._folder.started(self.proc.pid)
        os.close(in_r)
        os.close(out_w)
        os.set_blocking(in_w, False)
        os.set_blocking(out_r, False)
        self.q_in, self.q_out = in_w, out_r
        self.acc = b""
        self.pending_in.clear()
        self.state = "booting"
        self.cause = cause
        self.frozen = False
        self.booted.clear()
        self.boot_failed.clear()
        self.off.clear()
        b._bridge.reset(self.link_port, dcd_port)
        b._net.reset(net_port)
        self._wake()

    def kill(self, why, sig=signal.SIGKILL):
        with self.lock:
            p = self.proc
            if p is None or p.poll() is not None:
                return False
            self.expect = why
            if self.frozen:
                os.kill(p.pid, signal.SIGCONT)
            p.send_signal(sig)
            return True

    # -- relay (the loop is PortRelay._step) ----------------------------------------------
    def _device_fd(self):
        return self.q_out

    def _exited(self):
        self._ended()

    def _device_bytes(self, data):  # (QEMU closing its stdout is its end: _exited handles it)
        data = self.acc + data
        i = data.find(_UP)
        if i >= 0:  # printed by every boot (soft reboots too)
            data = data[:i] + data[i + len(_UP):]
        if i >= 0 and self.state == "booting":
            self.state = "on"
            self.booted.set()
            if self.pending_in:
                self._to_device(bytes(self.pending_in))
                self.pending_in.clear()
        # keep a possible start of the sentinel for the next read
        keep = 0
        for k in range(min(len(_UP) - 1, len(data)), 0, -1):
            if _UP.startswith(data[-k:]):
                keep = k
                break
        self.acc = data[len(data) - keep:] if keep else b""
        data = data[: len(data) - keep]
        if data:
            self.log.feed(data)
            self.backlog += data
            if len(self.backlog) > BACKLOG:
                del self.backlog[: len(self.backlog) - BACKLOG]

    def _read_host(self):
        try:
            data = os.read(self.m_out, 65536)
        except OSError:
            return
        if not data:
            return
        self.log.host_wrote(data)
        with self.lock:
            if self.state == "booting":  # the boot is not interruptible: held until the board is up
                self.pending_in += data
            elif self.state == "on":
                self._to_device(data)

    def _to_device(self, data):
        # QEMU takes the bytes as the UART does (one at a time as the firmware reads them): write in full
        while data:
            try:
                n = os.write(self.q_in, data)
                data = data[n:]
            except BlockingIOError:
                select.select([], [self.q_in], [], 0.05)
            except OSError:
                return  # QEMU is gone

    def _ended(self):
        p, self.proc = self.proc, None
        rc = p.returncode
        # what QEMU printed last
        while True:
            try:
                data = os.read(self.q_out, 65536)
            except OSError:
                break
            if not data:
                break
            self.acc += data
        if self.acc:
            self.log.feed(self.acc.replace(_UP, b""))
            self.acc = b""
        for fd in (self.q_in, self.q_out):
            os.close(fd)
        self.q_in = self.q_out = None
        why, self.expect = self.expect, None
        was, self.state = self.state, "off"
        self.frozen = False
        b = self.b
        # a restart spawns before it logs: a host waiting for the line finds the board booting, not off
        if why == "cycle":
            self.spawn("friendly", *b._next_boot())
            self.log.event("power cycle")
        elif why == "off":
            self.log.event("power off")
        elif why == "random-cut":
            self.log.event("power cut %s" % self.cut_note)
        elif rc == EXIT_POWER_CUT:
            cut = b.last_cut() or {}
            self.log.event("power cut at flash operation %s (%s)" % (cut.get("op"), " ".join(map(str, cut.get("torn") or ()))))
        elif rc == 0 and was == "on":
            self.spawn("friendly", *b._next_boot(), cause="hard")
            self.log.event("reset (machine.reset)")
        else:
            self.log.event("%s (QEMU exit status %s; see qemu.log)" % ("failed to boot" if was == "booting" else "crashed", rc))
            if was == "booting":
                self.boot_failed.set()
        if self.state == "off":
            self.off.set()

    def stop(self):
        if not self.running:
            return
        self._power_off()
        end = time.monotonic() + 2
        while self.proc is not None and time.monotonic() < end:  # let the relay take the exit
            time.sleep(0.02)
        self._close(self.q_in, self.q_out)


class _Bridge(BridgeLoop):
    """The link UART's far end: QEMU's socket on one side, `target` (host, port) on the other,
    dialled when the board starts an MQTT connection (sends CONNECT) and the far end is not
    connected (a modem in transparent mode).
    A far end that hangs up, or cannot be reached, is reported on the carrier line (QEMU's UART2
    socket) with the count of bytes put on the link in all: the board reads end of stream after the
    last of them (the two UARTs keep no order between them). A byte from the board on that line (its
    link stream was closed: a modem's DTR dropped) hangs up the far end."""

    what = "link bridge"  # (StepLoop's log line)

    def __init__(self, board):
        super().__init__("qemulink-%s" % board.id, board.log)
        self.target = None
        self.qport = self.dport = None
        self.q = self.far = self.dcd = None
        self.dials = 0
        self.sent = 0
        self.rem, self.hdr = 0, bytearray()

    def reset(self, qport, dport):
        """QEMU (re)started with its link socket on qport and its carrier line on dport."""
        with self.lock:
            self._close_q()
            self._close_far()
            self.qport, self.dport = qport, dport
            self.sent = 0  # bytes put on the board's link UART since it booted
            self.rem, self.hdr = 0, bytearray()  # MQTT framing of what the board sends
        self.wake()

    def _close_q(self):
        for s in (self.q, self.dcd):
            if s is not None:
                s.close()
        self.q = self.dcd = None

    def _close_far(self, hangup=False):
        if self.far is not None:
            self.far.close()
            self.far = None
        if hangup and self.dcd is not None:
            self.log.event("link: far end hung up")
            self._notify(0)

    def _notify(self, kind):
        # On the carrier line: kind (0 the far end hung up, 1 the board's hang-up was taken) and the
        # bytes put on the board's link UART in all
        if self.dcd is not None:
            try:
                self.dcd.sendall(bytes((kind,)) + (self.sent & 0xFFFFFFFF).to_bytes(4, "little"))
            except OSError:
                pass


    def _step(self):
        with self.lock:
            if self.q is None and self.qport is not None:
                try:
                    self.q = socket.create_connection(("127.0.0.1", self.qport), timeout=1)
                    self.q.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.dcd = socket.create_connection(("127.0.0.1", self.dport), timeout=1)
                    self.q.settimeout(None)  # QEMU takes the link's bytes at the board's pace
                    self.dcd.settimeout(None)
                except OSError:
                    self._close_q()
            q, far, dcd = self.q, self.far, self.dcd
        rl = [self.wake_r] + [s for s in (q, far, dcd) if s is not None]
        r, _, _ = select.select(rl, [], [], 0.1 if q is None else 0.5)
        if self.wake_r in r:
            os.read(self.wake_r, 4096)
        if dcd is not None and dcd in r:  # the board dropped the line (its stream was closed): hang up
            if self._recv(dcd) is not None:
                self._dtr_dropped(q, dcd)
                return
        if q is not None and q in r:
            data = self._recv(q)
            if data is None:
                with self.lock:
                    if self.q is q:
                        self._close_q()  # QEMU ended
                return
            with self.lock:
                self._from_board(data, self._starts(data))
                far = self.far
        if far is not None and far in r:
            with self.lock:  # a hang-up notice (link()) counts every byte put on the link before it
                if self.far is not far:
                    return
                data = self._recv(far)
                if data is None:
                    self._close_far(hangup=True)
                    return
                if q is not None:
                    try:
                        q.sendall(data)
                        self.sent += len(data)
                    except OSError:
                        pass

    def _starts(self, data):
        # Where MQTT packets start in data (the board's bytes are a sequence of whole packets; the
        # framing carries over from chunk to chunk): what lets a CONNECT be told from the tail of
        # the last connection's packets, which QEMU may still be passing on after a hang-up.
        starts = []
        i, n = 0, len(data)
        while i < n:
            if self.rem:
                k = min(self.rem, n - i)
                self.rem -= k
                i += k
                continue
            if not self.hdr:
                starts.append(i)
            self.hdr.append(data[i])
            i += 1
            if len(self.hdr) >= 2 and not self.hdr[-1] & 0x80:
                self.rem = sum((b & 0x7F) << (7 * j) for j, b in enumerate(self.hdr[1:]))
                self.hdr = bytearray()
            elif len(self.hdr) > 5:  # not MQTT framing: start again from the next byte
                self.hdr = bytearray()
        return starts

    def _from_board(self, data, starts):
        # With the far end up, everything goes; with none, a CONNECT at a packet start dials and
        # goes from there, anything before it is dropped, as a modem without carrier drops it.
        if self.far is None:
            at = next((k for k in starts if data[k] == 0x10), None)
            if at is None or self.target is None:
                return
            data = data[at:]
            try:
                self.far = socket.create_connection(self.target, timeout=2)
                self.far.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.dials += 1
                self.log.event("link: dialled %s:%d" % self.target)
            except OSError as e:
                self.log.event("link: cannot reach %s:%d: %s" % (self.target[0], self.target[1], e))
                self._close_far(hangup=True)  # NO CARRIER
                return
        try:
            self.far.sendall(data)
        except OSError:
            self._close_far(hangup=True)

    def _dtr_dropped(self, q, dcd):
        # What the board sent before it hung up goes out first (QEMU may pass the link's last bytes
        # on after the control line's: read until the link is quiet, up to a new CONNECT), then the
        # far end is closed, and the board is told how many bytes the link carried in all: the rest
        # of those (still on their way through QEMU) it discards, as a closed socket discards what
        # it did not read. A CONNECT read meanwhile dials a new connection after that.
        with self.lock:
            held = None
            try:
                while held is None and select.select([q], [], [], 0.05)[0]:
                    data = q.recv(65536)
                    if not data:
                        break
                    starts = self._starts(data)
                    at = next((k for k in starts if data[k] == 0x10), None)
                    if at is not None:
                        data, held = data[:at], (data[at:], [k - at for k in starts if k >= at])
                    if data and self.far is not None:
                        self.far.sendall(data)
            except OSError:
                pass
            self._close_far()
            self.log.event("link: the board dropped the line (%d bytes sent to it in all)" % self.sent)
            self._notify(1)
            if held is not None:
                self._from_board(*held)

    @staticmethod
    def _recv(s):
        try:
            data = s.recv(65536)
        except OSError:
            return None
        return data or None

    def _closed(self):
        self._close_q()
        self._close_far()


class QemuBoard(EmulatedBoard):
    """A qemu board: QemuBoard(profile="qemu-m3-esp32", workdir=None, board_id=None, echo=None,
    power=True, cut_at=0, seed=1, link=None, qemu_args=()). link: (host, port) the link UART reaches
    (the broker, or a chaos proxy); `link()` changes it; the board's sockets dial what its apps ask for.
    qemu_args: more options for QEMU at each power-on, e.g. ("-icount", "shift=0"): the guest clock
    advances 1 ns per instruction executed, and qboard.icount() counts instructions
    (tools/bench/cpu_bench.py). The firmware is built (or taken from the cache) first."""

    def __init__(self, profile="qemu-m3-esp32", workdir=None, board_id=None, echo=None, power=True, cut_at=0,
                 seed=1, link=None, qemu_args=()):
        prof = profile if isinstance(profile, dict) else load_profile(profile)
        if prof.get("kind") != FIRMWARE_KIND:
            raise ValueError("profile %r is not a qemu board's" % prof["name"])
        try:
            self.elf = build_firmware(prof, log=lambda s: None)
        except BuildError as e:
            raise BoardError("%s: no firmware: %s" % (prof["name"], e)) from None
        self._link = tuple(link) if link else None
        self.qemu_args = [str(a) for a in qemu_args]
        super().__init__(prof, workdir=workdir, board_id=board_id, echo=echo, power=power, cut_at=cut_at, seed=seed)

    def _supervisor(self):
        self._bridge = _Bridge(self)
        self._bridge.target = self._link
        self._bridge.start()
        self._net = NetBridge(self)
        self._net.start()
        return _Relay(self)

    def link(self, host, port=None):
        """Connect the link UART's far end to (host, port) from the next byte the board sends."""
        if port is None:
            host, port = host
        with self._bridge.lock:
            self._bridge.target = (host, int(port))
            self._bridge._close_far(hangup=self._bridge.far is not None)

    @property
    def link_dials(self):
        """How often the bridge dialled the far end (a new TCP connection to the broker)."""
        return self._bridge.dials

    @property
    def net_dials(self):
        """How many connections the board's `socket` module had the host dial."""
        return self._net.dials

    def close(self):
        super().close()
        self._bridge.stop()
        self._net.stop()
