"""The `tern` pytest plugin: fixtures for hardware-in-the-loop tests, installed with tern.

Registered through the ``pytest11`` entry point (name ``tern``, module ``ternlab.pytest_tern``, which loads
this one; ``-p ternlab.pytest_plugin`` works too), so any project that installs tern gets:

- ``broker`` -- a fresh Mosquitto on a free loopback port for the test (``ternlab.brokers.mosquitto.Broker``, no
  persistence, workdir under the test's tmp_path); ``broker_addr`` -- its ``[host, port]``;
- ``chaos`` -- an MQTT-aware ``ChaosProxy`` in front of that broker (seed 1);
- ``board`` -- the board the test drives: an ``EmulatedBoard`` of ``--board-profile`` (default
  ``unix-emulated``; a ``QemuBoard`` for the ``qemu-*`` profiles, whose sockets reach the host's loopback as
  the unix port's do, and whose link UART is joined to the test's ``chaos`` proxy or ``broker`` when it uses
  one), or, with ``--board-port /dev/ttyUSB0``, the real
  board on that port (``SerialBoard``) -- the same test body runs on all; ``board.deploy(app=..., config=...)``
  puts Tern and the app under test on it (then ``board.soft_reset()`` runs it);
- ``fleet`` -- a factory: ``fleet(boards=2, duration=10, faults=[...], seed=0)`` (or a ``Scenario``)
  returns a ``ternlab.fleet.Fleet`` with its own broker, stopped at teardown;
- marker ``@pytest.mark.board(capability="power_cut")`` (or ``capabilities=[...]``): the test is skipped,
  with a reason naming the missing capability and the profile, when the selected board lacks it.

When a test fails, its report gets a section per resource it used: the board's console log, the chaos
proxy's packet log (and events), the broker's log, and each fleet's fault log -- what one needs to see
why, without re-running. ``-p no:tern`` turns the plugin off.
"""

from __future__ import annotations

import pytest

DEFAULT_PROFILE = "unix-emulated"
ATTACH_LINES = 400          # the tail of each log that goes into a failure report
_ATTACH = pytest.StashKey[list]()


def pytest_addoption(parser):
    g = parser.getgroup("tern", "Tern hardware-in-the-loop")
    g.addoption("--board-port", default=None, metavar="PORT",
                help="drive a real board on this serial port instead of an emulated one")
    g.addoption("--board-profile", default=None, metavar="NAME",
                help=f"board profile (boards/NAME/profile.json; default {DEFAULT_PROFILE})")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "board(capability=None, capabilities=()): the test needs these board capabilities; "
        "skipped with the reason when the selected board profile lacks one")


# ------------------------------------------------------------------ attachments

def attach(request_or_item, title: str, source) -> None:
    """Register `source` (a callable returning text) to be attached as a section named `title` to the
    report of the running test if it fails. Fixtures call this; tests may too."""
    item = getattr(request_or_item, "node", request_or_item)
    item.stash.setdefault(_ATTACH, []).append((title, source))


def _tail(text: str, lines: int = ATTACH_LINES) -> str:
    parts = text.splitlines()
    if len(parts) <= lines:
        return text
    return f"[... {len(parts) - lines} earlier lines not shown]\n" + "\n".join(parts[-lines:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed or call.when == "collect":
        return
    for title, source in item.stash.get(_ATTACH, []):
        try:
            text = source()
        except Exception as e:  # a broken log must not hide the test's own failure
            text = f"(could not read: {e.__class__.__name__}: {e})"
        if text:
            report.sections.append((f"tern: {title}", _tail(text)))


# ------------------------------------------------------------------ broker and chaos

def _file_text(path) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


@pytest.fixture
def broker(request, tmp_path):
    """A fresh Mosquitto for this test (no persistence); its log is kept in tmp_path and attached to the
    report if the test fails."""
    from ternlab.brokers.mosquitto import Broker

    b = Broker(tmp_path / "broker")
    attach(request, f"broker log ({b.host}:{b.port})", lambda: _file_text(b.log_path))
    b.start()
    yield b
    b.stop()


@pytest.fixture
def broker_addr(broker):
    """The broker's address as JSON-friendly values, for tests that also run under MicroPython."""
    return [broker.host, broker.port]


def packet_log_text(proxy) -> str:
    """A chaos proxy's packets and events, one line each in time order, times relative to the first."""
    items = [(r.t, f"conn {r.conn} {r.direction} {r.type} len={r.length}"
              + (f" pid={r.pid}" if r.pid is not None else "")) for r in proxy.log]
    items += [(e.t, f"conn {e.conn} event {e.kind} {e.detail if e.detail else ''}".rstrip())
              for e in proxy.events]
    if not items:
        return ""
    items.sort(key=lambda x: x[0])
    t0 = items[0][0]
    return "\n".join(f"{t - t0:9.3f} {line}" for t, line in items)


@pytest.fixture
def chaos(request, broker):
    """An MQTT-aware chaos proxy in front of the test's broker; its packet log is attached on failure."""
    from ternlab.brokers.chaos import ChaosProxy

    with ChaosProxy(broker.address, seed=1) as proxy:
        attach(request, f"chaos packet log ({proxy.host}:{proxy.port})", lambda: packet_log_text(proxy))
        yield proxy


# ------------------------------------------------------------------ boards

def selected_profile_name(config) -> str:
    return config.getoption("--board-profile") or DEFAULT_PROFILE


def _load_profile(config):
    from ternlab.boards import load_profile

    key = "_tern_profile"
    cached = getattr(config, key, None)
    if cached is None:
        cached = load_profile(selected_profile_name(config))
        setattr(config, key, cached)
    return cached


def _capabilities(profile) -> set:
    caps = profile["capabilities"] if isinstance(profile, dict) else profile.capabilities
    return set(caps)


def _profile_name(profile) -> str:
    return profile["name"] if isinstance(profile, dict) else profile.name


def pytest_runtest_setup(item):
    required = []
    for m in item.iter_markers("board"):
        bad = set(m.kwargs) - {"capability", "capabilities"}
        if bad or m.args:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.board takes capability= or capabilities=, "
                                    f"not {', '.join(sorted(bad)) or repr(m.args)}")
        if m.kwargs.get("capability"):
            required.append(m.kwargs["capability"])
        required += list(m.kwargs.get("capabilities", ()))
    if not required:
        return
    try:
        profile = _load_profile(item.config)
    except Exception as e:
        raise pytest.UsageError(f"--board-profile {selected_profile_name(item.config)}: {e}") from None
    have = _capabilities(profile)
    missing = [c for c in required if c not in have]
    if missing:
        pytest.skip(f"board profile {_profile_name(profile)!r} lacks capabilit"
                    f"{'y' if len(missing) == 1 else 'ies'} {', '.join(map(repr, missing))}"
                    f" (it has: {', '.join(sorted(have)) or 'none'})")


def console_text(board) -> str:
    """A board's console log as its file has it: wall time, seconds since start, text."""
    return "".join(ln.format() for ln in list(board.log.lines))


@pytest.fixture
def board(request, tmp_path):
    """The board under test: an EmulatedBoard of --board-profile (default unix-emulated), powered on, its
    flash and logs in tmp_path; or, with --board-port, the real board on that port (SerialBoard). Closed
    after the test; its console log is attached to the report on failure."""
    config = request.config
    port = config.getoption("--board-port")
    name = selected_profile_name(config)
    if port:
        from ternlab.boards.serial import SerialBoard

        b = SerialBoard(port, profile=name, log_path=tmp_path / "board-console.log")
    elif _load_profile(config).get("kind") == "qemu":
        from ternlab.boards.qemu import QemuBoard

        # its sockets reach what the app dials; its link UART (stream=) is joined to the test's chaos proxy,
        # or else its broker, when the test uses one
        link = None
        for front in ("chaos", "broker"):
            if front in request.fixturenames:
                f = request.getfixturevalue(front)
                link = (f.host, f.port)
                break
        b = QemuBoard(name, workdir=tmp_path / "board", link=link)
    else:
        from ternlab.boards.emulated import EmulatedBoard

        b = EmulatedBoard(name, workdir=tmp_path / "board")
    attach(request, f"board console log ({name}{', ' + port if port else ''})", lambda: console_text(b))
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def fleet(request, tmp_path):
    """A factory for fleets: ``fleet(boards=2, duration=10, faults=[...], seed=0, **scenario_keys)`` or
    ``fleet(scenario, seed=0)`` (``relay=True``: through chaos proxies, see Fleet); returns a ``ternlab.fleet.Fleet`` with its own broker (persistence as
    the scenario says), not yet run (call ``.run()``). Its fault log, its broker's log and each board's
    console tail are attached on failure; every fleet is stopped at teardown."""
    from ternlab.fleet import Fleet, Scenario, parse_scenario

    made = []

    def make(scenario=None, *, seed: int = 0, out=None, callbacks=None, relay=False, **keys):
        if scenario is None:
            keys.setdefault("duration", 10.0)
            keys.setdefault("profile", selected_profile_name(request.config))
            keys["broker"] = {"log_packets": True, **keys.get("broker", {})}  # the attached broker log shows packets
            scenario = parse_scenario(keys, name=request.node.name)
        elif not isinstance(scenario, Scenario) or keys:
            raise TypeError("fleet(): pass a Scenario, or scenario keys as keyword arguments, not both")
        n = len(made)
        f = Fleet(scenario, seed=seed, out=out or tmp_path / f"fleet{n}",
                  replay=f"pytest {request.node.nodeid!r} (seed={seed})", callbacks=callbacks, relay=relay)
        made.append(f)
        attach(request, f"fleet {n} faults (seed={seed})", f.fault_log_text)
        attach(request, f"fleet {n} broker log", f.broker_log_text)
        attach(request, f"fleet {n} board consoles", f.console_tails)
        return f

    yield make
    for f in made:
        f.stop()
