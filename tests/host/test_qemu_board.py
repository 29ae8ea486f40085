"""QemuBoard: MicroPython's own firmware (the qemu port) for an Arm Cortex-M3 (MPS2-AN385) or a RISC-V
RV32 core (virt, the ESP32-C3's ISA) under QEMU. Everything here drives the real firmware through its
REPL UART, as mpremote drives a board. The boards that stand for users' boards run stock firmware
(nothing of Tern frozen: a test that needs Tern puts it in the ROMFS partition, qemukit); the frozen
profile (qemu-m3-tight) says so. MQTT over the link UART (stream=) goes to a real Mosquitto through
the chaos proxy; the boards' sockets are tests/host/test_qemu_net.py's.
"""

import json

import pytest

from ternlab.boards import firmware
from ternlab.boards import BoardError, DeviceError, load_profile
from ternlab.boards.emulated import EmulatedBoard
from ternlab.boards.qemu import QemuBoard

from qemukit import BOTH_ISAS, ISAS, stock_board


@pytest.fixture
def qb(tmp_path):
    """A stock Cortex-M3 board (qemu-m3-esp32), nothing installed."""
    b = QemuBoard("qemu-m3-esp32", workdir=tmp_path / "board", board_id="qemu-1")
    yield b
    b.close()


@pytest.fixture
def qbt(tmp_path):
    """The same with Tern in its ROMFS partition, as `mpremote romfs deploy` would put it."""
    b = stock_board("qemu-m3-esp32", tmp_path, board_id="qemu-1")
    yield b
    b.close()


def test_profiles_and_firmware_cache(tmp_path):
    profs = {n: load_profile(n) for n in firmware.qemu_profiles()}
    assert {n: p["heap_bytes"] for n, p in profs.items()} == {
        "qemu-m3-esp32": 110000, "qemu-m3-rp2": 194560, "qemu-m3-tight": 32768, "qemu-rv32-c3": 140000}
    assert {n for n, p in profs.items() if firmware.frozen(p)} == {"qemu-m3-tight"}  # the others stand for users' boards
    tight = firmware.build("qemu-m3-tight")
    assert tight.is_file() and firmware.build("qemu-m3-tight") == tight  # from the cache: same content, same image
    stock = firmware.build("qemu-m3-esp32")
    assert stock == firmware.build("qemu-m3-rp2")  # one image per machine and kind: the heap is given at boot
    assert len({tight, stock, firmware.build("qemu-rv32-c3")}) == 3
    with pytest.raises(firmware.BuildError, match="not a qemu board"):
        firmware.build("unix-emulated")
    with pytest.raises(firmware.BuildError, match="more than the qemu firmware holds"):
        firmware.build(dict(profs["qemu-m3-esp32"], heap_bytes=firmware.HEAP_MAX + 16))
    with pytest.raises(ValueError, match="runs under QEMU .*tern board run --profile qemu-m3-tight"):
        EmulatedBoard("qemu-m3-tight", workdir=tmp_path / "x")


def test_tern_firmware_build_command():
    import subprocess
    import sys
    from pathlib import Path

    tern = str(Path(sys.executable).with_name("tern"))
    r = subprocess.run([tern, "firmware", "build", "--board", "qemu-m3-tight"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "qemu-m3-tight: %s" % firmware.build("qemu-m3-tight"), r
    r = subprocess.run([tern, "firmware", "build", "--board", "tight"], capture_output=True, text=True)
    assert r.returncode == 1 and "profile tight is not a qemu board" in r.stderr, r


def test_the_frozen_profile_runs_tern_from_its_firmware(tmp_path):
    # qemu-m3-tight: Tern and the app frozen in; its filesystem and ROMFS empty
    b = QemuBoard("qemu-m3-tight", workdir=tmp_path / "board")
    try:
        out = b.exec("import sys, gc, os\nimport tern.client, tern.flashstore, telemetry\n"
                     "print(sys.platform, sys.maxsize, sys.implementation._machine, os.listdir('/'), sys.path)\n"
                     "gc.collect(); print(gc.mem_free() + gc.mem_alloc())")
        first, heap = out.strip().splitlines()
        assert first.startswith("qemu 2147483647 ") and "Cortex-M3" in first, first
        assert first.endswith("[] ['', '.frozen', '/lib']"), first
        assert 30000 < int(heap) <= 32768  # the profile's heap, less the collector's own tables
        assert b.eval("tern.client.__file__") == "tern/client.py"  # frozen
    finally:
        b.close()


@BOTH_ISAS
def test_a_stock_board_has_nothing_of_tern_and_imports_what_lib_and_romfs_hold(tmp_path, qemu_profile):
    # as an ESP32 or a Pico with MicroPython from micropython.org: the firmware's own sys.path, Tern
    # absent until installed, then imported from where it was installed (ROMFS ahead of /lib)
    from qemukit import romfs_with_tern

    prof = load_profile(qemu_profile)
    b = QemuBoard(prof, workdir=tmp_path / "board")
    try:
        out = b.exec("import sys, gc\nprint(sys.platform, sys.maxsize, sys.implementation._machine)\n"
                     "print(sys.path)\ngc.collect(); print(gc.mem_free() + gc.mem_alloc())\n"
                     "try:\n import tern\nexcept ImportError as e:\n print(e)\n")
        first, path, heap, err = out.strip().splitlines()
        assert first.startswith("qemu 2147483647 ") and ("Cortex-M3" if ISAS[qemu_profile] == "cortex-m3" else "rv32imac") in first
        assert path == "['', '.frozen', '/lib']" and err == "no module named 'tern'", out
        assert prof["heap_bytes"] - 4096 < int(heap) <= prof["heap_bytes"]  # the heap given at boot, less the GC's tables
        b.mkdir("lib")
        b.mkdir("lib/tern")
        b.write_file("lib/tern/__init__.py", "WHERE = 'lib'\n")
        b.soft_reset()
        assert b.eval("__import__('tern').WHERE") == "lib"
        b.write_romfs(romfs_with_tern(prof["arch"], workdir=tmp_path / "rom"))
        b.power_cycle()  # the ROMFS partition is mounted at boot, ahead of /lib, as on a board
        assert b.eval("__import__('sys').path") == ["", ".frozen", "/rom", "/rom/lib", "/lib"]
        assert b.eval("__import__('tern.client').client.__file__") == "/rom/lib/tern/client.mpy"
        assert b.eval("__import__('vfs').rom_ioctl(1)") == 1  # vfs.rom_ioctl, as mpremote romfs query/deploy use it
    finally:
        b.close()


def test_files_survive_a_power_cycle_and_the_reset_cause_says_why(qb):
    qb.write_file("data.bin", bytes(range(256)) * 8)
    assert qb.eval("__import__('emuboard').reset_cause()") == 1  # PWRON
    qb.power_cycle()
    assert qb.read_file("data.bin") == bytes(range(256)) * 8
    qb.soft_reset()
    assert qb.eval("__import__('emuboard').reset_cause()") == 5  # SOFT
    qb.exec_nowait("import emuboard\nemuboard.reset()")  # machine.reset(): QEMU ends, the host boots it again
    qb.wait_for(r"reset \(machine.reset\)", kind="event")
    qb._wait_booted(10)
    assert qb.eval("__import__('emuboard').reset_cause()") == 2 and qb.reset_cause == "hard"


def test_ctrl_c_stops_running_code(qb):
    qb.exec_nowait("while True:\n pass")
    assert qb.eval("6 * 7") == 42  # mpremote's Ctrl-C reached the busy loop (KeyboardInterrupt)
    with pytest.raises(DeviceError, match="ZeroDivisionError"):
        qb.exec("1/0")


def test_nor_flash_program_clears_bits_only_and_erase_sets_ff(qb):
    out = qb.exec(
        "import emuboard\np = emuboard.partition('outbox')\nb = bytearray(16)\n"
        "p.ioctl(6, 1)\np.readblocks(1, b, 100)\nprint(bytes(b) == b'\\xff' * 16)\n"
        "p.writeblocks(1, b'\\xf0' * 16, 100)\np.writeblocks(1, b'\\x30' * 16, 100)\n"
        "p.readblocks(1, b, 100)\nprint(bytes(b).hex())\n"
        "try:\n p.writeblocks(1, b'\\x0f', 100)\nexcept ValueError as e:\n print(e)\n"
        "print(p.ioctl(4, 0), p.ioctl(5, 0))\n")
    lines = out.strip().splitlines()
    assert lines[0] == "True" and lines[1] == "30" * 16
    assert lines[2].startswith("NOR: program would set bits") and "0x30" in lines[2], lines[2]
    assert lines[3] == "32 4096"
    w = qb.flash_counters()  # written through to the host's image and wear file
    assert w["partitions"]["outbox"]["erases"] == 1
    part = qb.read_partition("outbox")
    assert part[4096 + 100 : 4096 + 116] == b"\x30" * 16


@BOTH_ISAS
def test_power_cut_at_the_nth_flash_operation_tears_it_and_the_flash_keeps_it(tmp_path, qemu_profile):
    qb = QemuBoard(qemu_profile, workdir=tmp_path / "board")
    try:
        _power_cut_at_the_nth_flash_operation(qb)
    finally:
        qb.close()


def _power_cut_at_the_nth_flash_operation(qb):
    qb.exec("import emuboard\np = emuboard.partition('outbox')\np.ioctl(6, 0)\np.ioctl(6, 1)")
    qb.arm_cut(2, seed=3)
    qb.exec_nowait("p.writeblocks(0, b'\\x00' * 64, 0)\np.writeblocks(1, b'\\x00' * 512, 0)\nprint('not reached')")
    qb.wait_off(10)
    cut = qb.last_cut()
    assert cut["nth"] == 2 and cut["torn"][0] in ("program-prefix", "program-bits"), cut
    assert "not reached" not in qb.console_text()
    part = qb.read_partition("outbox")
    assert part[:64] == b"\x00" * 64  # the first program landed
    torn = part[4096 : 4096 + 512]
    assert torn != b"\x00" * 512 or cut["torn"][0] == "program-bits"  # the second is torn
    with pytest.raises(BoardError, match="powered off"):
        qb.exec("print(1)")
    qb.power_on()
    assert qb.eval("__import__('emuboard').reset_cause()") == 1
    b = qb.exec("import emuboard\nb = bytearray(64)\nemuboard.partition('outbox').readblocks(0, b)\nprint(bytes(b) == bytes(64))")
    assert b.strip() == "True"


def test_pubsub_over_the_link_uart_through_the_chaos_proxy(qbt, chaos):
    qb = qbt  # (Tern in its ROMFS partition)
    # MQTT over a serial line: the board's client uses the link UART as its stream; the host bridges
    # it to a TCP connection through the chaos proxy to Mosquitto.
    qb.link(chaos.address)
    out = qb.exec(
        "import emuboard\nfrom tern.client import Client\n"
        "got = []\n"
        "c = Client('qemu-ps', version=5, stream=emuboard.uart())\n"
        "c.subscribe('q/echo', 1, handler=lambda m: got.append((m.topic, bytes(m.payload), m.qos)))\n"
        "print(c.connect())\n"
        "for i in range(3):\n c.publish('q/echo', b'r%d' % i, qos=1)\n"
        "c.wait_all(10)\n"
        "while len(got) < 3:\n c.loop(100)\n"
        "print(got)\n", timeout=30)
    lines = out.strip().splitlines()
    assert lines[0] == "False"
    assert lines[1] == "[('q/echo', b'r0', 1), ('q/echo', b'r1', 1), ('q/echo', b'r2', 1)]"
    # the far end hangs up: the bridge says so on the carrier line, the client reads end of stream and
    # reconnects over the same UART (a new dial)
    chaos.cut_now()
    out = qb.exec(
        "lost = []\nc.on_disconnect = lost.append\nc.backoff_min = 0.05\n"
        "while not lost or not c.connected:\n c.loop(50)\n"
        "c.wait_published(c.publish('q/echo', b'after', qos=1), 10)\n"
        "while len(got) < 4:\n c.loop(100)\n"
        "print(lost[0], got[-1])\nc.disconnect()\n", timeout=30)
    assert out.strip() == "connection closed by the broker ('q/echo', b'after', 1)", out
    kinds = [p.type for p in chaos.packets(direction="c2b")]
    assert kinds.count("PUBLISH") == 4 and kinds.count("CONNECT") == 2 and kinds[-1] == "DISCONNECT", kinds
    assert qb.link_dials == 2


AIO_OVER_THE_LINK = """import asyncio, emuboard
from tern.aio import Client
async def main():
    c = Client('qemu-aio', version=5, stream=emuboard.uart(), clean=False, session_expiry=60,
               backoff_min=0.05, backoff_max=0.2)
    lost = []
    c.on_disconnect = lost.append
    await c.connect()
    print(await c.subscribe('q/aio', 1))
    it = c.messages()
    got = []
    for i in range(4):
        await c.publish('q/aio', b'a%d' % i, qos=1)
        while True:  # (QoS 1 is at least once: the cut may take a PUBACK with it, and its message comes again)
            m = await asyncio.wait_for(it.__anext__(), 10)
            if m.payload == b'a%d' % i:
                break
        got.append(m)
    await c.wait_all(10)
    print([(m.topic, m.payload) for m in got], got[3].dup)
    print(lost)
    await c.disconnect()
asyncio.run(main())
"""


def test_aio_over_the_link_uart_through_the_chaos_proxy(qbt, chaos):
    qb = qbt  # (Tern in its ROMFS partition)
    # tern.aio with stream=: MicroPython's asyncio polls the link UART (its ioctl) as it polls a socket.
    # The proxy drops the 4th PUBLISH and cuts: the bridge raises the carrier, the client reads end of
    # stream and reconnects over the same UART (a new dial), and the message goes again.
    qb.link(chaos.address)
    chaos.cut_at_packet("PUBLISH", 4, "c2b", connections=1)
    out = qb.exec(AIO_OVER_THE_LINK, timeout=60)
    assert out.strip().splitlines() == [
        "[1]", "[('q/aio', b'a0'), ('q/aio', b'a1'), ('q/aio', b'a2'), ('q/aio', b'a3')] False",
        "[OSError('connection closed by the broker',)]"], out
    kinds = [p.type for p in chaos.packets(direction="c2b")]
    assert kinds.count("CONNECT") == 2 and kinds[-1] == "DISCONNECT", kinds
    # On the new connection the client sends again exactly what the broker had not acknowledged to it on
    # the first, in order: the dropped 4th message, and the 3rd too when the cut took its PUBACK with it.
    first = [p.pid for p in chaos.packets(direction="c2b", type="PUBLISH") if p.conn == 1]
    acked = {p.pid for p in chaos.packets(direction="b2c", type="PUBACK") if p.conn == 1}
    again = [p.pid for p in chaos.packets(direction="c2b", type="PUBLISH") if p.conn == 2]
    assert len(first) == 3 and acked >= set(first[:2]), (first, acked)
    assert again == [pid for pid in first if pid not in acked] + [first[-1] + 1], (first, acked, again)
    assert qb.link_dials == 2


def test_board_json_is_what_the_firmware_boots_from(qb):
    cfg = json.loads((qb.workdir / "board.json").read_text())
    assert cfg["id"] == "qemu-1" and cfg["profile"]["name"] == "qemu-m3-esp32"
    assert qb.eval("__import__('emuboard').unique_id()") == b"qemu-1"
    assert qb.eval("__import__('emuboard').PROFILE['heap_bytes']") == 110000


def test_closing_the_link_stream_hangs_up_and_drops_what_the_old_connection_left(qbt, chaos):
    qb = qbt  # (Tern in its ROMFS partition)
    # close() on the board's link stream drops the line (DTR on the control UART): the bridge hangs up
    # the far end, and bytes of that connection still on their way to the board are discarded, as a
    # closed socket discards what it did not read; the next CONNECT dials a new connection.
    qb.link(chaos.address)
    out = qb.exec(
        "import emuboard\nfrom tern.client import Client\n"
        "u = emuboard.uart()\n"
        "c = Client('qemu-dtr', version=4, stream=u)\nc.connect()\n"
        "c.subscribe('q/fill', 0)\n"
        "print(u.any())\n", timeout=30)
    assert out.strip() == "0"
    from tern.client import Client

    host = Client("host-fill", server=chaos.address[0], port=chaos.address[1])
    host.connect()
    for i in range(20):  # 20 x 400 bytes towards the board, which does not read them
        host.publish("q/fill", b"f" * 400, qos=0)
    host.disconnect()
    out = qb.exec("import time\ntime.sleep_ms(300)\nprint(u.any() > 0)\nu.close()\ntime.sleep_ms(300)\n"
                  "print(u.any(), u.read(4096))\n", timeout=30)
    assert out.split() == ["True", "0", "None"], out  # nothing of the dropped connection is read
    # the board's connection is the proxy's first; the host's (the second) may end before it
    closed = [e for e in chaos.events if e.kind == "closed" and e.conn == 1]
    assert closed and closed[0].detail["reason"] == "client closed", chaos.events
    out = qb.exec("c.connect()\nc.subscribe('q/x', 1)\nprint(c.connected)\nc.disconnect()\n", timeout=30)
    assert out.strip() == "True"
    assert qb.link_dials == 2


def _far_end(*payloads):
    # A far end that, for each connection in turn, takes the board's first packet, sends that
    # connection's payload and hangs up at once: its last bytes and the hang-up reach the board
    # together, on two UARTs that keep no order between them.
    import socket
    import threading

    srv = socket.create_server(("127.0.0.1", 0))

    def serve():
        for p in payloads:
            conn, _ = srv.accept()
            with conn:
                got = b""
                while len(got) < 5:  # all of _DIAL: closing with its bytes unread would reset the
                    more = conn.recv(64)  # connection, and a reset throws away what was sent
                    if not more:
                        break
                    got += more
                conn.sendall(p)
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()


# The board dials (a packet that starts as CONNECT does), then reads until three reads in a row
# return end of stream (or 5 s pass): what it got, and whether anything came after the first end.
_DIAL = "u.write(b'\\x10\\x03\\x00\\x01x')\n"
_READ_TO_EOF = (
    "buf = bytearray(512)\ngot = bytearray()\neofs = late = 0\nt = time.ticks_ms()\n"
    "while eofs < 3 and time.ticks_diff(time.ticks_ms(), t) < 5000:\n"
    " n = u.readinto(buf)\n"
    " if n == 0:\n  eofs += 1\n"
    " elif n:\n  late += eofs > 0\n  got += buf[:n]\n"
    "print(len(got), eofs, late, got == PAYLOAD)\n")


@pytest.mark.parametrize("size", [4, 3000])
def test_the_far_ends_last_bytes_then_end_of_stream_for_good(qb, size):
    # A far end that sends and hangs up: the board read its last bytes and then end of stream only
    # once (a read that found bytes first went on, took the end and returned the bytes: the end was
    # lost, and the client never noticed the outage), or before the bytes still on their way through
    # the link UART. Now every byte comes, then end of stream on every read, as from a socket.
    payload = bytes(i % 251 for i in range(size))
    qb.link(_far_end(payload))
    out = qb.exec("import emuboard, time\nu = emuboard.uart()\n" + _DIAL
                  + _READ_TO_EOF.replace("PAYLOAD", repr(payload)), timeout=30)
    assert out.split() == [str(size), "3", "0", "True"], out
    assert qb.link_dials == 1


def test_a_new_dial_after_a_hang_up_drops_what_the_old_connection_left_unread(qb):
    # The board dials, the far end sends and hangs up while the board reads nothing; the board dials
    # again: it reads the new connection's bytes only (they came after the old one's, which a socket
    # of the old connection would have taken with it).
    import time

    qb.link(_far_end(b"old" * 100, b"new"))
    qb.exec("import emuboard, time\nu = emuboard.uart()\n" + _DIAL)
    end = time.monotonic() + 10
    while not any("far end hung up" in x.text for x in qb.log.lines) and time.monotonic() < end:
        time.sleep(0.02)
    out = qb.exec("time.sleep_ms(200)\n" + _DIAL + _READ_TO_EOF.replace("PAYLOAD", "b'new'"), timeout=30)
    assert out.split() == ["3", "3", "0", "True"], out
    assert qb.link_dials == 2



def test_a_hang_up_notice_that_crosses_the_boards_own_hang_up_does_not_end_the_next_connection(qb, monkeypatch):
    # The far end hangs up just as the board, having read its last bytes, drops the line itself and
    # dials again. The far end's notice then reaches the board after its own hang-up (here the
    # control line is made slow, in order, to make that happen every time): it is the dropped
    # connection's, and must not end the next one (it did, once the next one's first bytes were
    # read), and the new CONNECT must not overtake the hang-up on its way to the bridge (it could
    # dial a connection the hang-up then closed).
    import queue
    import socket
    import threading
    import time

    from ternlab.boards import qemu

    line = queue.Queue()
    kinds = []

    def slow_line():
        while True:
            dcd, data = line.get()
            time.sleep(0.3)
            try:
                dcd.sendall(data)
            except OSError:
                pass

    threading.Thread(target=slow_line, daemon=True).start()

    def notify_late(self, kind):
        kinds.append(kind)
        if self.dcd is not None:
            line.put((self.dcd, bytes((kind,)) + (self.sent & 0xFFFFFFFF).to_bytes(4, "little")))

    monkeypatch.setattr(qemu._Bridge, "_notify", notify_late)
    srv = socket.create_server(("127.0.0.1", 0))
    dials = []

    def serve():
        for p, hold in ((b"old", 0), (b"new", 3)):
            conn, _ = srv.accept()
            with conn:
                got = b""
                while len(got) < 5:
                    more = conn.recv(64)
                    if not more:
                        break
                    got += more
                dials.append(got)
                conn.sendall(p)
                time.sleep(hold)  # the second connection stays open while the board reads
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    qb.link(srv.getsockname())
    out = qb.exec(
        "import emuboard, time\nu = emuboard.uart()\n" + _DIAL
        + "got = b''\nwhile len(got) < 3:\n got += u.read(3) or b''\n"
        "u.close()\n" + _DIAL
        + "buf = bytearray(64)\ngot = bytearray()\neofs = 0\nt = time.ticks_ms()\n"
        "while time.ticks_diff(time.ticks_ms(), t) < 1500:\n"
        " n = u.readinto(buf)\n if n == 0:\n  eofs += 1\n elif n:\n  got += buf[:n]\n"
        "print(bytes(got), eofs)\n", timeout=30)
    assert kinds[:2] == [0, 1], kinds  # the far end's hang-up notice, then the answer to the board's
    assert out.split() == ["b'new'", "0"], out
    assert dials == [b"\x10\x03\x00\x01x"] * 2 and qb.link_dials == 2
