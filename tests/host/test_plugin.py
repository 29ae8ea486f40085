"""The tern pytest plugin, tested through real inner pytest sessions (pytester): its fixtures, its
registration by the installed entry point, and the logs it attaches to a failing test's report."""

import pytest

INNER_BROKER_CHAOS = """
from tern.client import Client

def _talk(addr):
    c = Client("inner-1", server=addr[0], port=addr[1], version=5)
    c.connect()
    c.publish("inner/x", b"hello", qos=1)
    c.wait_all(timeout=5)
    c.disconnect()

def test_passes(broker, broker_addr, chaos):
    assert broker.running() and broker_addr == [broker.host, broker.port]
    assert chaos.upstream == broker.address
    _talk(chaos.address)
    assert chaos.wait_for(lambda: len(chaos.packets(type="DISCONNECT")) == 1, 5)

def test_fails(broker, chaos):
    _talk(chaos.address)
    chaos.wait_for(lambda: len(chaos.packets(type="DISCONNECT")) == 1, 5)
    assert False, "the inner test fails on purpose"
"""


def test_broker_and_chaos_fixtures_attach_their_logs_to_a_failing_test(pytester):
    pytester.makepyfile(test_inner=INNER_BROKER_CHAOS)
    r = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    r.assert_outcomes(passed=1, failed=1)
    out = r.stdout.str()
    # one section per resource, for the failing test only
    assert out.count("tern: broker log (127.0.0.1:") == 1
    assert out.count("tern: chaos packet log (127.0.0.1:") == 1
    chaos_part = out.split("tern: chaos packet log")[1]
    for line in ("conn 1 c2b CONNECT", "conn 1 b2c CONNACK", "conn 1 c2b PUBLISH", "conn 1 b2c PUBACK len=5 pid=1",
                 "conn 1 c2b DISCONNECT", "conn 1 event accepted"):
        assert line in chaos_part
    broker_part = out.split("tern: broker log")[1].split("tern: chaos packet log")[0]
    assert "New client connected" in broker_part and "inner-1" in broker_part


def test_the_plugin_is_registered_by_the_installed_entry_point(pytester):
    """A separate interpreter with no conftest gets the fixtures from the entry point alone, and
    `-p no:tern` takes them away again."""
    pytester.makepyfile(test_inner="def test_it(broker_addr):\n    assert broker_addr[0] == '127.0.0.1'\n")
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    r.assert_outcomes(passed=1)
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-p", "no:tern")
    r.assert_outcomes(errors=1)
    r.stdout.fnmatch_lines(["*fixture 'broker_addr' not found*"])


@pytest.mark.parametrize("spelling", ["ternlab.pytest_plugin", "tern"])
def test_the_plugin_named_with_p_beside_the_entry_point_loads_once(pytester, spelling):
    """`python -m pytest -p ternlab.pytest_plugin` stopped with "Plugin already registered under a
    different name": the module was registered under that name, then again as the entry point `tern`."""
    pytester.makepyfile(test_inner="def test_it(broker_addr):\n    assert broker_addr[0] == '127.0.0.1'\n")
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-p", spelling)
    assert "already registered" not in r.stdout.str() + r.stderr.str()
    r.assert_outcomes(passed=1)


def test_a_helper_attaches_its_own_log_and_a_broken_source_does_not_hide_the_failure(pytester):
    pytester.makepyfile(test_inner="""
from ternlab.pytest_plugin import attach

def test_it(request):
    attach(request, "device notes", lambda: "line one\\nline two")
    attach(request, "broken", lambda: 1 / 0)
    assert 1 == 2
""")
    r = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*tern: device notes*", "line one", "line two", "*tern: broken*",
                            "(could not read: ZeroDivisionError: division by zero)", "*assert 1 == 2*"])


def test_long_logs_are_cut_to_their_tail():
    from ternlab.pytest_plugin import ATTACH_LINES, _tail

    text = "\n".join(str(i) for i in range(ATTACH_LINES + 50))
    cut = _tail(text)
    assert cut.splitlines()[0] == "[... 50 earlier lines not shown]"
    assert cut.splitlines()[1:] == [str(i) for i in range(50, ATTACH_LINES + 50)]
    assert _tail("a\nb") == "a\nb"


@pytest.mark.parametrize("opt", ["--board-port", "--board-profile"])
def test_board_options_are_in_the_help(pytester, opt):
    r = pytester.runpytest_inprocess("--help")
    r.stdout.fnmatch_lines([f"*{opt}*"])


MARKED = """
import pytest

@pytest.mark.board(capability="wifi")
def test_needs_wifi():
    pass

@pytest.mark.board(capabilities=["power_cut", "flash"])
def test_needs_power_cuts():
    pass
"""


def test_the_board_marker_skips_naming_the_missing_capability_and_the_profile(pytester):
    pytester.makepyfile(test_inner=MARKED)
    r = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rs")
    r.assert_outcomes(passed=1, skipped=1)
    r.stdout.fnmatch_lines(["*board profile 'unix-emulated' lacks capability 'wifi' "
                            "(it has: console, flash, host_broker, power_cut)*"])
    r = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rs", "--board-profile", "esp32-generic")
    r.assert_outcomes(passed=1, skipped=1)
    r.stdout.fnmatch_lines(["*board profile 'esp32-generic' lacks capability 'power_cut' (it has: console, flash, wifi)*"])
    r = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--board-profile", "esp99")
    assert r.ret != 0
    assert "unknown board profile 'esp99'" in r.stdout.str() + r.stderr.str()


BOARD_TESTS = """
def test_runs_code(board):
    assert board.exec("print(6 * 7)") == "42\\n"
    assert board.profile["name"] == "unix-emulated"

def test_fails_with_its_console(board):
    board.exec("print('console line from the board')")
    assert False
"""


def test_the_board_fixture_is_an_emulated_board_and_its_console_is_attached(pytester):
    pytester.makepyfile(test_inner=BOARD_TESTS)
    r = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    r.assert_outcomes(passed=1, failed=1)
    out = r.stdout.str()
    assert out.count("tern: board console log (unix-emulated)") == 1
    assert "# power on" in out.split("tern: board console log")[1]


def test_board_port_drives_a_real_board_through_the_serial_port(pytester, tmp_path):
    """--board-port swaps the emulated board for SerialBoard; here the 'real' board is an EmulatedBoard's
    pseudo-terminal, the one thing on this machine that behaves like a board on USB serial."""
    from ternlab.boards.emulated import EmulatedBoard

    target = EmulatedBoard("unix-emulated", workdir=tmp_path / "target")
    try:
        pytester.makepyfile(test_inner="""
def test_it(board):
    from ternlab.boards.serial import SerialBoard
    assert isinstance(board, SerialBoard) and board.port == %r
    assert board.exec("import sys; print(sys.platform)") == "linux\\n"
""" % target.port)
        r = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", "--board-port", target.port,
                                         "--board-profile", "unix-emulated")
        r.assert_outcomes(passed=1)
    finally:
        target.close()
