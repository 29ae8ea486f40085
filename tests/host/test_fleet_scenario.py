"""Fleet scenarios and fault schedules: strict reading of the TOML file (one error naming the key) and a
schedule that is a pure function of (scenario, seed)."""

import subprocess
import sys
from pathlib import Path

import pytest

from ternlab.fleet.scenario import ScenarioError, load_scenario, parse_scenario
from ternlab.fleet.schedule import collector_id, make_schedule

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.toml"))


def write(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_the_shipped_scenarios_load_and_name_themselves():
    names = {load_scenario(p).name for p in SCENARIOS}
    assert {"smoke", "demo"} <= names
    smoke = load_scenario(ROOT / "scenarios" / "smoke.toml")
    assert smoke.boards == 2 and smoke.persistence
    assert {f.kind for f in smoke.faults} == {"power_cut", "network_cut", "broker_restart"}
    assert smoke.firmware["interval_ms"] == 200


def test_defaults_and_ranges(tmp_path):
    s = load_scenario(write(tmp_path, 'duration = 5\n[[faults]]\nkind = "network_cut"\nlength = 2\n'))
    assert (s.name, s.boards, s.profile, s.fault_start, s.persistence) == ("s", 2, "unix-emulated", 1.0, True)
    assert s.faults[0].length == (2.0, 2.0) and s.faults[0].count == 1


@pytest.mark.parametrize("text, named", [
    ('duration = 5\nbaords = 3\n', "unknown key 'baords'"),
    ('duration = 5\n[[faults]]\nkind = "network_cut"\nlenght = [1, 2]\n', "unknown key 'faults[0].lenght'"),
    ('duration = 5\n[[faults]]\nkind = "network_cut"\n[[faults]]\nkind = "power_cut"\nlength = 1\n',
     "unknown key 'faults[1].length'"),
    ('duration = 5\n[broker]\npersist = true\n', "unknown key 'broker.persist'"),
    ('duration = 5\n[broker]\nlog_packets = "yes"\n', "broker.log_packets must be true or false"),
    ('boards = 2\n', "duration is missing"),
    ('duration = "long"\n', "duration must be a number"),
    ('duration = 0\n', "duration must be > 0"),
    ('duration = 5\nboards = 0\n', "boards must be in 1.."),
    ('duration = 5\nboards = 2.5\n', "boards must be an integer"),
    ('duration = 5\nwarmup = 9\n', "warmup (9 s) must not exceed duration"),
    ('duration = 5\n[[faults]]\ncount = 1\n', "faults[0].kind is missing"),
    ('duration = 5\n[[faults]]\nkind = "flood"\n', "faults[0].kind must be one of power_cut"),
    ('duration = 5\n[[faults]]\nkind = "power_cut"\nat = "noon"\n', "faults[0].at must be one of"),
    ('duration = 5\n[[faults]]\nkind = "power_cut"\nflash_ops = [9, 3]\n', "faults[0].flash_ops must be [low, high]"),
    ('duration = 5\n[[faults]]\nkind = "power_cut"\nflash_ops = [0, 3]\n', "faults[0].flash_ops[0] must be in 1.."),
    ('duration = 5\n[[faults]]\nkind = "network_cut"\nlength = [1, 2, 3]\n', "faults[0].length must be [low, high]"),
    ('duration = 5\n[[faults]]\nkind = "broker_restart"\nmode = "gentle"\n', "faults[0].mode must be one of"),
    ('duration = 5\n[broker]\npersistence = false\n[[faults]]\nkind = "broker_restart"\n',
     "broker.persistence must be true"),
    ('duration = 5\n[[faults]]\nkind = "network_cut"\nwindow = [7, 9]\n', "faults[0].window starts after"),
    ('duration = 5\nfirmware = 3\n', "firmware must be a table"),
    ('duration = 5\nfaults = 3\n', "faults must be an array of tables"),
    ('duration = 5\n[[faults]]\nkind = "collector_kill"\n', "faults[0].kind collector_kill needs collectors"),
    ('duration = 5\n[collectors]\ncount = 2\nbatch = 1\n', "unknown key 'collectors.batch'"),
    ('duration = 5\n[collectors]\ncount = 17\n', "collectors.count must be in 0..16"),
    ('duration = 5\n[collectors]\ngroup = "a/b"\n', "collectors.group must be non-empty without"),
    ('duration = 5\n[collectors]\nbatch_time = 0\n', "collectors.batch_time must be > 0"),
    ('duration = 5\n[[faults]]\nkind = "power_cut"\nper_board = 1\n', "faults[0].per_board must be true or false"),
    ('duration = 5\n[[faults]]\nkind = "broker_restart"\nper_board = true\n', "unknown key 'faults[0].per_board'"),
    ('duration = 5\n[collectors]\ncount = 1\n[[faults]]\nkind = "collector_kill"\ndown = [3, 1]\n',
     "faults[0].down must be [low, high]"),
    ('duration = = 5\n', "not valid TOML"),
])
def test_a_bad_scenario_is_one_error_naming_the_file_and_the_key(tmp_path, text, named):
    p = write(tmp_path, text)
    with pytest.raises(ScenarioError) as e:
        load_scenario(p)
    msg = str(e.value)
    assert msg.startswith(str(p) + ": ") and named in msg and "\n" not in msg


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ScenarioError, match="nothere.toml: cannot read the scenario"):
        load_scenario(tmp_path / "nothere.toml")


def test_command_line_overrides_are_checked_too():
    s = parse_scenario({"duration": 10, "warmup": 4}, name="x")
    assert s.with_overrides(boards=16, duration=30).boards == 16
    with pytest.raises(ScenarioError, match="--boards must be in 1"):
        s.with_overrides(boards=0)
    with pytest.raises(ScenarioError, match="warmup .4 s. must not exceed duration .3 s."):
        s.with_overrides(duration=3)


FAULTY = {"boards": 5, "duration": 30, "warmup": 1, "faults": [
    {"kind": "power_cut", "count": 6, "flash_ops": [5, 50], "off": [0.1, 2]},
    {"kind": "network_cut", "count": 4, "length": [1, 3], "window": [10, 20]},
    {"kind": "broker_restart", "count": 2},
]}


def test_the_schedule_is_a_function_of_the_seed():
    s = parse_scenario(FAULTY, name="f")
    a, b, c = make_schedule(s, 42), make_schedule(s, 42), make_schedule(s, 43)
    assert a == b and a != c
    assert len(a) == 12 and [f.index for f in a] == list(range(12))
    assert [f.t for f in a] == sorted(f.t for f in a)
    for f in a:
        assert 1 <= f.t <= 30
        if f.kind == "power_cut":
            assert 0 <= f.target < 5 and 0.1 <= f.params["off"] <= 2 and f.params["at"] in ("flash_op", "time")
            assert f.params["at"] == "time" or 5 <= f.params["flash_op"] <= 50
        elif f.kind == "network_cut":
            assert 10 <= f.t <= 20 and 1 <= f.params["length"] <= 3 and 0 <= f.target < 5
        else:
            assert f.target is None and isinstance(f.params["hard"], bool)
    assert {f.params["at"] for f in a if f.kind == "power_cut"} == {"flash_op", "time"}


def test_adding_a_fault_entry_leaves_the_others_where_they_were():
    s1 = parse_scenario(FAULTY, name="f")
    s2 = parse_scenario(dict(FAULTY, faults=FAULTY["faults"] + [{"kind": "network_cut", "count": 3}]), name="f")
    key = lambda f: (f.t, f.kind, f.target, tuple(sorted(f.params.items())))
    assert {key(f) for f in make_schedule(s1, 9)} <= {key(f) for f in make_schedule(s2, 9)}


def test_the_schedule_is_the_same_in_another_process():
    """No hash randomisation or clock leaks into it: a fresh interpreter draws the same faults."""
    code = ("from ternlab.fleet.scenario import load_scenario; from ternlab.fleet.schedule import collector_id, make_schedule;"
            "print([f.as_dict() for f in make_schedule(load_scenario(%r), 5)])" % str(ROOT / "scenarios/demo.toml"))
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": h}).stdout for h in ("1", "2")}
    assert len(runs) == 1
    assert runs.pop().strip() == str([f.as_dict() for f in make_schedule(load_scenario(ROOT / "scenarios/demo.toml"), 5)])


@pytest.mark.parametrize("seed", [-1, 1.5, "7", True])
def test_a_bad_seed_is_refused(seed):
    with pytest.raises(ScenarioError, match="seed must be a non-negative integer"):
        make_schedule(parse_scenario({"duration": 1}, name="x"), seed)


def test_per_board_faults_hit_every_board_and_collector_kills_name_a_collector():
    s = parse_scenario({"boards": 3, "duration": 20, "collectors": {"count": 2, "group": "g"}, "faults": [
        {"kind": "power_cut", "per_board": True, "count": 2, "at": "flash_op", "flash_ops": [1, 9], "window": [2, 8]},
        {"kind": "collector_kill", "count": 3, "down": [1, 2]},
    ]}, name="p")
    assert (s.collectors.count, s.collectors.group, s.collectors.batch_time) == (2, "g", 1.0)
    a = make_schedule(s, 4)
    assert a == make_schedule(s, 4)
    cuts = [f for f in a if f.kind == "power_cut"]
    assert sorted(f.target for f in cuts) == [0, 0, 1, 1, 2, 2]
    assert all(2 <= f.t <= 8 and 1 <= f.params["flash_op"] <= 9 for f in cuts)
    kills = [f for f in a if f.kind == "collector_kill"]
    assert len(kills) == 3 and all(f.target in (0, 1) and 1 <= f.params["down"] <= 2 for f in kills)
    # the schedule names a collector by its id, as the fault records and collectors/<id>.log do
    # (it said "collector 0" for the process whose id and fault records say collector-1)
    assert f"SIGKILL {collector_id(kills[0].target)}, restarted" in kills[0].describe()
    assert [collector_id(i) for i in range(2)] == ["collector-1", "collector-2"]  # the ids docs/demo.md names


def test_the_demo_scenarios_cut_power_on_every_board_and_stretch_with_the_duration():
    for name, boards in (("demo", 4), ("demo-short", 2)):
        s = load_scenario(ROOT / "scenarios" / f"{name}.toml")
        assert s.boards == boards and s.collectors.count == 2
        sched = make_schedule(s, 1)
        assert sorted(f.target for f in sched if f.kind == "power_cut") == list(range(boards))
        assert {f.kind for f in sched} == {"power_cut", "network_cut", "broker_restart", "collector_kill"}
        assert all(not f.params["hard"] for f in sched if f.kind == "broker_restart")
    demo = load_scenario(ROOT / "scenarios" / "demo.toml")
    half = demo.with_overrides(duration=60, stretch=True)
    assert [f.window for f in half.faults] == [(w[0] / 2, w[1] / 2) for w in (f.window for f in demo.faults)]
    assert half.warmup == demo.warmup / 2 and half.settle == demo.settle
    assert demo.with_overrides(duration=60).faults == demo.faults  # tern fleet run keeps absolute windows
