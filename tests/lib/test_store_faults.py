"""Storage that fails and returns (issue 35): what an exception means when a write, program or sync
itself fails, on both runtimes.

The contract (lib/tern/store.py, "When storage fails"): an exception from publish() at QoS 1/2
means the message never reaches the broker, now or after any reboot, unless it is OutboxUnknown
(the store could not tell); the session builds no packet from a flag the store lost; nothing but
OSError comes out of a store after a failure; an inbound QoS 2 message whose id cannot be recorded
is resent by the broker, not left waiting; once the fault is gone the store takes messages again.

The first four tests are the defects found on 78fd1db, each failing there; then samples of the
sweeps tools/store_sweep.py runs in full (target faults: a storage failure at every operation of a
session workload, in every store mode) and of the model (tests/lib/model.py) with its faults.
"""

from check import MICROPYTHON, raises
from storekit import rmtree, tmppath
from tern.codec import Packet, decode, encode
from tern.filestore import FileStore, OsFs
from tern.flashstore import FlashStore
from tern.session import Session, CONNECTED
from tests.lib.faults import AFTER, BEFORE, ENOSPC, Fault, FaultFlash, FaultFs
from tests.lib.kit import Wire

MP_HEAPSIZE = "4m"
MP_TIMEOUT = 280


def connect(s, sp=False):
    s.connect_packet(0)
    s.feed(encode(Packet(2, session_present=sp), 4), 0)
    assert s.state == CONNECTED


def file_store(path, fault, **opts):
    return FileStore(path, fs=FaultFs(OsFs(), fault), verbose=False, **opts).open()


# -- defect 1 ------------------------------------------------------------------------------
def test_fsync_that_fails_after_the_bytes_landed_never_sends_what_publish_refused():
    """FileStore, with and without group commit: the sync of a QoS 2 reading's record fails after
    its bytes reached the file. publish() raises (not accepted): the record must never be sent,
    neither now nor after a reboot. On 78fd1db the store read the file again and kept it: not
    sent on that boot, sent after the next one, and the app's republished copy was delivered as
    well (QoS 2 twice)."""
    for group in (False, True):
        path = tmppath("fsyncafter")
        fault = Fault()
        try:
            st = file_store(path, fault, group_commit=group)
            s = Session("d1", 4, False, store=st)
            w = Wire(s)
            fault.arm("sync", AFTER, 1)
            e = raises(OSError, s.publish, "t", b"reading 5", 2, False, 0)
            assert "unknown" not in str(e), e  # (the store could tell: it voided the record)
            assert s.pending() == [] and st.pending() == [], (group, st.pending())
            pid = s.publish("t", b"reading 5", 2, False, 0)  # the app publishes that reading again
            st.close()
            st2 = file_store(path, Fault())  # reboot: what is durable
            assert st2.pending() == [pid], (group, st2.pending(), pid)
            s2 = Session("d1", 4, False, store=st2)
            w2 = Wire(s2)
            connect(s2, True)
            assert [p.payload for p in w2.out if p.type == 3] == [b"reading 5"], w2.out
            st2.close()
            assert not w.out
        finally:
            rmtree(path)


# -- defect 2 ------------------------------------------------------------------------------
def test_failed_program_in_a_group_commit_never_sends_what_publish_refused():
    """FlashStore(group_commit=True), acks in place and appended: one flash program fails during
    the commit inside publish() (before any byte landed, or after all did). publish() raises; the
    app publishes the reading again; after a reboot exactly one copy is there. On 78fd1db the
    record stayed in the group buffer and its packet id in the index, the next commit programmed
    it and both copies went out (QoS 2 twice)."""
    for acks in (False, True):
        for when in (BEFORE, AFTER):
            fault = Fault()
            dev = FaultFlash(None, blocks=4, block_size=1024, fault=fault)
            st = FlashStore(dev, append_acks=acks, group_commit=True, verbose=False).open()
            s = Session("d2", 4, False, store=st)
            s.send = lambda b, o, n: None
            s.publish("t", b"reading 1", 2, False, 0)
            fault.arm("write", when, 1)
            raises(OSError, s.publish, "t", b"reading 2", 2, False, 0)
            s.publish("t", b"reading 2", 2, False, 0)  # published again
            st.commit()
            boot = FaultFlash(None, blocks=4, block_size=1024)
            boot.mem[:] = dev.mem
            st2 = FlashStore(boot, verbose=False, append_acks=acks).open()
            got = []
            for p in st2.pending():
                b = bytearray(st2.size(p))
                st2.read(p, 0, b)
                got.append(decode(bytes(b), 4).payload)
            assert got == [b"reading 1", b"reading 2"], (acks, when, got)


# -- defect 3 ------------------------------------------------------------------------------
class ReleaseFails(FileStore):
    """A FileStore whose next release's write fails (the fault armed right before it)."""

    fail_release = False

    def release(self, pid):
        if self.fail_release:
            self.fail_release = False
            self.fs.fault.arm("write", BEFORE, 1)
        return FileStore.release(self, pid)


def test_the_session_sends_no_pubrel_for_a_mark_the_store_lost():
    """FileStore(group_commit=True) on POSIX files: one read holds PUBREC(1) and PUBACK(2); the mark
    of 1 waits in the buffer (written, not synced) and the release of 2 fails. The session must
    follow what the store durably holds: on the reconnect with the session present it sends no
    PUBREL(1) unless the mark is durable (a power cut right after it must find the mark), else it
    resends the PUBLISH of 1 (the broker answers PUBREC again). On 78fd1db the store read the file
    again (the mark still in the page cache, not durable) and the session's RAM ring said
    "marked": PUBREL(1) went out, and after a power cut the store held 1 unmarked: the broker,
    which forgot 1 at that PUBREL, took the PUBLISH sent again as a new message (QoS 2 twice)."""
    from tests.lib.kit import CutFs, CutLayer
    import os

    path = tmppath("lostmark")
    fault = Fault()
    try:
        cfs = CutFs(0, 1)
        st = ReleaseFails(path, fs=FaultFs(CutLayer(cfs), fault), group_commit=True, verbose=False).open()
        s = Session("d3", 4, False, store=st)
        w = Wire(s)
        connect(s)
        assert s.publish("t", b"q2", 2, False, 0) == 1 and s.publish("t", b"q1", 1, False, 0) == 2
        st.fail_release = True
        try:
            s.feed(encode(Packet(5, pid=1), 4) + encode(Packet(4, pid=2), 4), 0)
        except OSError:
            s.connection_lost()  # (the driver's rule)
        assert (6, 1) not in w.types(), w.types()
        connect(s, True)
        after = w.types()[w.types().index((1, 0), 1):]  # what the second connection carried
        # the power goes now: each file keeps what was synced
        for name in os.listdir(path):
            p = path + "/" + name
            with open(p, "rb") as f:
                data = f.read(cfs.synced.get(p, 1 << 30))
            with open(p, "wb") as f:
                f.write(data)
        st2 = FileStore(path, verbose=False).open()
        if (6, 1) in after:
            assert st2.marked(1), "PUBREL(1) sent, the mark it announces lost at the cut: %r" % w.types()
        else:
            assert (3, 1) in after, w.types()  # the PUBLISH again, DUP set
            assert [p.dup for p in w.out if p.type == 3 and p.pid == 1] == [False, True], w.out
        assert st2.pending()[:1] == [1], st2.pending()
        st2.close()
    finally:
        rmtree(path)


# -- defect 4 ------------------------------------------------------------------------------
def test_a_store_that_failed_raises_only_oserror_and_takes_messages_again():
    """FileStore(group_commit=True) after a transient ENOSPC: a write fails while a release waits,
    and while the filesystem is full no segment can be made. Nothing but OSError may come out of
    the store then (the drivers handle OSError as connection or storage trouble; anything else is
    a bug that propagates: on a board main.py dies), and once there is room the first packets and
    publish() work again, without a reboot. On 78fd1db the first packet after (a QoS 0 message,
    PINGREQ, CONNECT) raised AttributeError, at every packet until a QoS 1/2 append opened a
    segment."""
    path = tmppath("enospc")
    fault = Fault()
    try:
        st = file_store(path, fault, group_commit=True)
        s = Session("d4", 4, False, store=st, keepalive=1)
        w = Wire(s)
        connect(s)
        pid = s.publish("t", b"first", 1, False, 0)
        s.feed(encode(Packet(4, pid=pid), 4), 0)  # its release waits for the next commit
        fault.arm("any", BEFORE, 1, -1, ENOSPC)  # the filesystem is full: writes, syncs, creates
        raises(OSError, s.publish, "t", b"second", 1, False, 0)
        for call in (lambda: s.publish("t", b"zero", 0, False, 10), lambda: s.poll(5000)):
            try:
                call()
            except Exception as e:
                assert isinstance(e, OSError), "%r out of a store that failed" % e
        fault.heal()  # room again
        if s.state != CONNECTED:
            connect(s, True)
        s.publish("t", b"zero", 0, False, 20)
        s.poll(10000)  # PINGREQ
        pid = s.publish("t", b"third", 1, False, 30)
        # (the release of "first" waited for a commit that never came: it went with the failure,
        # and "first" was resent after the reconnect, as group commit says: README, Store modes)
        assert pid and st.pending() in ([pid], [1, pid]), st.pending()
        assert (12, 0) in w.types() and [p.payload for p in w.out if p.type == 3][-1] == b"third", w.types()
        st.close()
    finally:
        rmtree(path)


# -- inbound QoS 2 that cannot be recorded ---------------------------------------------------
def test_an_inbound_qos2_id_that_cannot_be_recorded_brings_a_reconnect():
    """An inbound QoS 2 message whose id the store cannot record (ENOSPC, a failed write) is
    neither delivered nor acknowledged, and, no other id being held, the session disconnects at
    once so that the broker sends it again after the reconnect; then it is delivered once. On
    78fd1db it waited for an unrelated disconnect while the broker's window filled."""
    path = tmppath("inrec")
    fault = Fault()
    try:
        st = file_store(path, fault)
        s = Session("d5", 4, False, store=st)
        got = []
        s.on_message = lambda m: got.append(bytes(m.payload))
        w = Wire(s)
        connect(s)
        fault.arm("write", BEFORE, 1)
        e = raises(OSError, s.feed, encode(Packet(3, topic="i", payload=b"m1", qos=2, pid=7), 4), 0)
        assert "resend" in str(e), e
        assert got == [] and w.types()[-1] == (14, 0) and s.state != CONNECTED, w.types()  # DISCONNECT
        assert s.stats_deferred == 1
        connect(s, True)
        s.feed(encode(Packet(3, topic="i", payload=b"m1", qos=2, pid=7, dup=True), 4), 0)
        assert got == [b"m1"] and w.types()[-1] == (5, 7), w.types()
        st.close()
    finally:
        rmtree(path)


# -- samples of the sweeps ------------------------------------------------------------------
def test_sweep_sample_storage_failure_at_operations_of_a_session_workload():
    """A sample of tools/store_sweep.py --only faults: the workload of tests/lib/walsweep.py with a
    storage failure (before, after, torn; once or until the end) at sampled operations, FlashStore
    in place and appended, group commit or not, FileStore on POSIX; every model invariant holds."""
    from tests.lib import walsweep
    from tests.lib.kit import sample

    n = 2 if MICROPYTHON else 4
    for name in ("flash", "group-flash-acks", "posix", "group-posix"):
        ops = walsweep.fault_ops(name)
        assert ops > 50, (name, ops)  # the workload writes: the points below are inside it
        found = walsweep.fault_sweep(name, sample(ops, n, 7))
        assert not found, "\n".join(found)


def test_sweep_sample_storage_failure_on_littlefs():
    from tests.lib import walsweep

    found = walsweep.fault_sweep("group-lfs", (9, 61), ((AFTER, 1), (BEFORE, -1)))
    assert not found, "\n".join(found)
