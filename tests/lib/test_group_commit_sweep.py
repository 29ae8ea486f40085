"""The write-ahead rule under group commit, with power cuts (tests/lib/walsweep.py):
a sample of the cut points tools/store_sweep.py runs in full (targets group-*),
on both runtimes (LittleFS: MicroPython's VfsLfs2, littlefs-python on CPython).
Every cut point of each is in docs/benchmarks.md."""

from tests.lib import walsweep
from tests.lib.kit import sample

MP_HEAPSIZE = "8m"


def check(name, n_ops, pkt_step):
    ops, pkts = walsweep.totals(name)
    assert ops > 20 and pkts > 30, (name, ops, pkts)  # the workload ran: the cut points below are inside it
    found = walsweep.sweep(name, sample(ops, n_ops, 3), range(1, pkts + 1, pkt_step))
    assert not found, "\n".join(found)


def test_group_commit_flash_in_place():
    check("group-flash", 16, 2)


def test_group_commit_flash_appended_acks():
    check("group-flash-acks", 16, 2)


def test_group_commit_filestore_posix():
    check("group-posix", 16, 3)


def test_group_commit_filestore_littlefs():
    check("group-lfs", 8, 5)
