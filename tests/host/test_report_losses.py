"""The report's rules for where a message was lost and which fault was in its way (ternlab.pipeline.losses),
on hand-made fault logs and flights: each case is what the rule says, worked out by hand."""

from ternlab.pipeline import losses
from ternlab.pipeline.losses import DEVICE, PIPELINE, UNKNOWN


def rec(index, kind, target, status, ts, detail=""):
    return {"index": index, "kind": kind, "target": target, "status": status, "ts": ts, "detail": detail}


# the run of the issue: a network cut on board-000 from 100 to 103, a collector killed at 110 (back at 112)
ISSUE_RUN = [rec(0, "network_cut", "board-000", "injected", 100.0), rec(0, "network_cut", "board-000", "restored", 103.0),
             rec(1, "collector_kill", "collector-1", "injected", 110.0, "SIGKILL with 3 message(s) received and not yet written"),
             rec(1, "collector_kill", "collector-1", "restored", 112.0)]


def test_a_loss_between_broker_and_landing_names_the_collector_kill_in_its_flight_not_the_older_cut():
    faults = losses.fault_log(ISSUE_RUN)
    # a QoS 0 reading sent at 109.5 (7 s after the cut ended), seen by the observer at 109.6, never landed;
    # landed copies waited up to 1 s for their file: it should have landed by 110.6
    fl = losses.flight(109.5, 109.6, 1.0)
    assert fl == (109.5, 110.6)
    f = losses.blame("board-000", PIPELINE, fl, faults)
    assert (f["index"], f["kind"], f["target"]) == (1, "collector_kill", "collector-1")
    # the same reading, had the observer never seen it (lost before the broker): a collector kill cannot lose
    # it there, and the network cut had ended before it was sent: no fault overlapped
    assert losses.blame("board-000", DEVICE, losses.flight(109.5, 111.0, 1.0), faults) is None


def test_overlap_is_sharing_a_moment_with_the_flight():
    assert losses.overlaps((10.0, 12.0), (12.0, 13.0))        # starts as the flight ends
    assert losses.overlaps((10.0, 12.0), (8.0, 10.0))         # ends as the flight starts
    assert not losses.overlaps((10.0, 12.0), (7.0, 9.99))     # over before the send
    assert not losses.overlaps((10.0, 12.0), (12.01, 20.0))   # began after the expected landing
    assert losses.overlaps((10.0, 12.0), (5.0, None))         # lasted to the end of the run
    assert losses.overlaps((10.0, None), (50.0, 51.0))        # nothing shows the broker ever had it
    assert losses.overlaps((None, 12.0), (1.0, 2.0))          # sent before anything is known
    assert losses.overlaps((10.0, 12.0), (11.0, 11.0))        # an instant (an arm's power cycle)


def test_only_a_fault_that_can_lose_it_there_is_named():
    faults = losses.fault_log([
        rec(0, "power_cut", "board-001", "injected", 10.0), rec(0, "power_cut", "board-001", "restored", 11.0),
        rec(1, "collector_kill", "collector-2", "injected", 10.2), rec(1, "collector_kill", "collector-2", "restored", 12.0),
        rec(2, "power_cut", "board-000", "injected", 10.4), rec(2, "power_cut", "board-000", "restored", 11.0),
        rec(3, "broker_restart", "broker", "injected", 10.6), rec(3, "broker_restart", "broker", "restored", 10.7)])
    fl = (10.0, 11.0)  # every fault above acted during it
    # before the broker: the device's own power cut (not board-001's), before the broker restart
    assert losses.blame("board-000", DEVICE, fl, faults)["index"] == 2
    # after the broker: the collector kill; a board's power cut cannot lose what the broker had
    assert losses.blame("board-000", PIPELINE, fl, faults)["index"] == 1
    # only the broker restart left: it can lose a message on either side
    no_kill = [f for f in faults if f["kind"] != "collector_kill"]
    assert losses.blame("board-000", PIPELINE, fl, no_kill)["index"] == 3
    assert losses.blame("board-002", DEVICE, fl, faults)["index"] == 3
    # two of the same kind: the one that started latest
    two = losses.fault_log([rec(0, "collector_kill", "collector-1", "injected", 10.1),
                            rec(1, "collector_kill", "collector-2", "injected", 10.5)])
    assert losses.blame("board-000", UNKNOWN, fl, two)["index"] == 1


def test_every_fault_is_in_the_log_with_what_became_of_it():
    faults = losses.fault_log([
        rec(0, "power_cut", "board-000", "armed", 5.0), rec(0, "power_cut", "board-000", "unfired", 30.0, "the run ended first"),
        rec(1, "power_cut", "board-001", "armed", 6.0), rec(1, "power_cut", "board-001", "fired", 7.0),
        rec(1, "power_cut", "board-001", "restored", 8.0),
        rec(2, "power_cut", "board-001", "injected", 9.0), rec(2, "power_cut", "board-001", "restored", 9.5),
        rec(3, "network_cut", "board-000", "skipped", 10.0, "network already cut"),
        {"index": 4, "kind": "broker_restart", "target": "broker", "status": "injected", "ts": None}])
    got = {f["index"]: (f["outcome"], f["spans"], f["boots"]) for f in faults}
    assert got == {
        0: ("armed-not-fired", [(5.0, 5.0)], [5.0]),    # its power cycle still rebooted the board
        1: ("armed -> fired -> restored", [(6.0, 6.0), (7.0, 8.0)], [6.0, 8.0]),
        2: ("injected -> restored", [(9.0, 9.5)], [9.5]),
        3: ("skipped", [], []),                          # listed, acted nowhere
    }  # a record without a wall time cannot be placed: left out
    assert "unfired: the run ended first" in faults[0]["detail"]
    # in the log, a fault lasts from its first span to the end of its last
    assert [(f["start"], f["end"]) for f in faults] == [(5.0, 5.0), (6.0, 8.0), (9.0, 9.5), (10.0, 10.0)]


def test_every_reboot_is_explained_or_said_unexplained():
    faults = losses.fault_log([
        rec(0, "power_cut", "board-000", "armed", 20.0), rec(0, "power_cut", "board-000", "unfired", 90.0),
        rec(1, "power_cut", "board-000", "injected", 60.0), rec(1, "power_cut", "board-000", "restored", 61.0),
        rec(2, "power_cut", "board-001", "injected", 40.0), rec(2, "power_cut", "board-001", "restored", 41.0)])
    windows = {"board-000": [(0, 1.0, 19.8), (1, 20.3, 39.0), (2, 40.2, 59.9), (4, 62.0, 80.0)]}
    rows = losses.explain_reboots(windows, faults)
    got = [(r["from_boot"], r["to_boot"], r["reboots"], [f["index"] for f in r["explained_by"]], r["unexplained"])
           for r in rows]
    assert got == [
        (0, 1, 1, [0], 0),   # the arm's power cycle (the cut never fired)
        (1, 2, 1, [], 1),    # board-001's cut at 40-41 is not this board's
        (2, 4, 2, [1], 1),   # two boots, one power back: one unexplained
    ]
    assert [r["events"] for r in rows] == [["#0 power_cut: the power cycle that armed it"], [], ["#1 power_cut: power back"]]


def test_flight_ends_at_the_expected_landing():
    assert losses.flight(10.0, 10.5, 1.0) == (10.0, 11.5)
    assert losses.flight(10.0, 9.9, 1.0) == (10.0, 11.0)   # an observer clock behind the device's
    assert losses.flight(10.0, None, 1.0) == (10.0, None)
    assert losses.flight(None, 10.5, 0.0) == (None, 10.5)
