"""FlashStore beyond the shared contract: reclaim under long workloads, bounded
boot, bad partitions, bit flips, group commit, RAM and allocation."""

from binascii import crc32

from check import MICROPYTHON, Rng, allocated, raises, read_all
from norflash import NorFlash, PowerCut
from storekit import tmppath, rm
from tern.store import PUBLISH, SUBSCRIBE
from tern.flashstore import FlashStore, FlashCorrupt

MP_HEAPSIZE = "4m"


def reopen(dev, path, blocks, **opts):
    dev.close()
    dev = NorFlash(path, blocks=blocks)
    return dev, FlashStore(dev, **opts).open()


def payload(pid, n=78):
    b = bytearray(n)
    for i in range(n):
        b[i] = (pid * 7 + i) & 0xFF
    return bytes(b)


def long_workload(append_acks):
    """Thousands of records through 6 sectors with a small pending window, one
    record stuck pending all along, marks, inbound ids and meta: nothing live
    is lost, order is kept, reclaim copies the stuck ones forward."""
    p = tmppath("long")
    blocks = 6
    try:
        dev = NorFlash(p, blocks=blocks)
        st = FlashStore(dev, append_acks=append_acks).open()
        st.append(SUBSCRIBE, 65000, b"\x82\x08", b"stuck-sub")  # never acknowledged
        st.mark(65000)
        st.in_add(77)
        st.set_meta("client", b"board-1")
        window = []
        rng = Rng(5)
        pid = 0
        for i in range(3000):
            pid = pid % 60000 + 1
            st.append(PUBLISH, pid, b"\x32\x4e", payload(pid))
            window.append(pid)
            if rng.below(5) == 0:
                st.mark(pid)
            while len(window) > 1 + rng.below(8):
                st.release(window.pop(rng.below(min(2, len(window)))))
            if i % 700 == 0:
                st.set_meta("boot", b"%d" % i)
            if i % 1000 == 999:
                dev, st = reopen(dev, p, blocks, append_acks=append_acks)
                assert st.pending() == [65000] + window, (st.pending(), window)
        assert st.pending() == [65000] + window
        assert st.marked(65000) and st.kind(65000) == SUBSCRIBE and read_all(st, 65000) == b"\x82\x08stuck-sub"
        for q in window:
            assert read_all(st, q) == b"\x32\x4e" + payload(q)
        c = dev.counters()
        # the log really went round many times, and the stuck record with it
        assert c["erases_total"] >= 3000 * 104 // 4096 - blocks, c
        assert max(c["erases"]) - min(c["erases"]) <= 2, c["erases"]  # wear is even
        dev, st = reopen(dev, p, blocks, append_acks=append_acks)
        assert st.pending() == [65000] + window
        assert st.in_has(77) and st.meta("client") == b"board-1" and st.meta("boot") == b"2800"
        assert st.last_pid() == pid
        dev.close()
    finally:
        rm(p)


def test_reclaim_long_workload_in_place():
    long_workload(False)


def test_reclaim_long_workload_appended_acks():
    long_workload(True)


def test_boot_reads_bounded_by_partition_not_history():
    p = tmppath("boot")
    blocks = 8
    try:
        dev = NorFlash(p, blocks=blocks)
        st = FlashStore(dev).open()
        reads = []
        pid = 0
        for rounds in range(3):
            for i in range(1500):
                pid = pid % 60000 + 1
                st.append(PUBLISH, pid, b"\x32\x4e", payload(pid))
                if i % 4 == 3:
                    for q in st.pending()[:-1]:
                        st.release(q)
            dev, st = reopen(dev, p, blocks)
            assert st.stats["headers_read"] == blocks
            reads.append(st.stats["bytes_read"])
        # history grew 3x; the boot work did not, and stays within the partition size
        assert max(reads) <= blocks * 4096, reads
        assert max(reads) <= 2 * min(reads) + 8192, reads
        # retired sectors are not scanned: a small window scans few sectors
        assert st.stats["sectors_scanned"] <= 3, st.stats
        dev.close()
    finally:
        rm(p)


def test_garbage_partition_is_formatted_before_use():
    p = tmppath("junk")
    try:
        dev = NorFlash(p, blocks=5)
        rng = Rng(99)
        junk = rng.bytes(4096)
        for b in range(5):  # programming random bytes over erased flash is legal
            if b == 2:
                junk[0:4] = b"TnF1"  # a magic without a valid header
            dev.writeblocks(b, junk, 0)
        dev.close()
        dev = NorFlash(p, blocks=5)
        st = FlashStore(dev, verbose=False).open()
        assert st.pending() == [] and st.count() == 0 and st.last_pid() == 0
        for pid in range(1, 200):
            st.append(PUBLISH, pid, b"\x32\x4e", payload(pid))
            if pid > 3:
                st.release(pid - 3)
        assert st.pending() == [197, 198, 199]
        dev, st = reopen(dev, p, 5)
        assert st.pending() == [197, 198, 199] and read_all(st, 198) == b"\x32\x4e" + payload(198)
        assert dev.counters()["erases_total"] >= 5  # every junk sector erased before use
        dev.close()
    finally:
        rm(p)


def test_random_images_never_crash_open():
    for seed in range(1, 9):
        dev = NorFlash(None, blocks=4)
        rng = Rng(seed)
        for b in range(4):
            dev.writeblocks(b, rng.bytes(4096), 0)
        st = FlashStore(dev, verbose=False).open()
        st.append(PUBLISH, 1, b"\x32\x02", b"ok")
        st.set_meta("k", b"v")
        st2 = FlashStore(dev, verbose=False).open()
        assert st2.pending() == [1] and read_all(st2, 1) == b"\x32\x02ok" and st2.meta("k") == b"v"


def test_bit_flips_skip_one_record_only():
    """Flip random bits inside one written record: that record is skipped with
    a warning, every other record is intact, read() never returns garbage."""
    p = tmppath("flip")
    try:
        for trial in range(12):
            rng = Rng(1000 + trial)
            dev = NorFlash(p, blocks=4, fresh=True)
            st = FlashStore(dev).open()
            addrs = {}
            for pid in range(1, 31):
                st.append(PUBLISH, pid, b"\x32\x4e", payload(pid))
                addrs[pid] = st._iaddr[st._find(pid)] & ~7
            victim = 2 + rng.below(28)
            a = addrs[victim]
            size = 16 + 80 + 4
            dev.close()
            with open(p, "r+b") as f:
                f.seek(0)
                img = bytearray(f.read())
                for _ in range(1 + rng.below(3)):
                    pos = a + rng.below(size)
                    if pos - a in (12, 13):  # status bytes are covered by majority, not CRC
                        pos += 2
                    img[pos] ^= 1 << rng.below(8)
                f.seek(0)
                f.write(img)
            dev = NorFlash(p, blocks=4)
            st = FlashStore(dev).open()
            want = [q for q in range(1, 31) if q != victim]
            assert st.pending() == want, (victim, st.pending())
            for q in want:
                assert read_all(st, q) == b"\x32\x4e" + payload(q)
            st.append(PUBLISH, 31, b"\x32\x01", b"z")  # and it goes on working
            dev, st = reopen(dev, p, 4)
            assert st.pending() == want + [31]
            dev.close()
    finally:
        rm(p)


def _toggles(st, pid, n, reopen):
    """Mark, unmark, mark ... pid n times, each followed by a reboot; yields the reopened store
    (marked after the 1st, 3rd, ... toggle)."""
    for k in range(n):
        if k % 2 == 0:
            st.mark(pid)
        else:
            st.unmark(pid)
        st = reopen()
        yield st


def _fill(st):
    """Append messages 1, 2, ... until the store refuses one with ENOSPC; returns that one's pid."""
    pid = 0
    while True:
        pid += 1
        try:
            st.append(PUBLISH, pid, b"\x32\x4e", payload(pid))
        except OSError as e:
            assert e.args[0] == 28, e.args
            return pid
        assert pid < 2000


def test_too_large_and_full_fail_cleanly():
    dev = NorFlash(None, blocks=4)
    st = FlashStore(dev).open()
    e = raises(ValueError, st.append, PUBLISH, 1, b"\x32\x00", bytes(4096))
    assert "does not fit" in str(e)
    pid = _fill(st)
    kept = st.pending()
    assert kept == list(range(1, pid)) and len(kept) >= (2 * 4000 - 640) // 104 - 2, len(kept)
    st2 = FlashStore(dev).open()
    assert st2.pending() == kept
    for q in kept[:-1]:
        st2.release(q)
    st2.append(PUBLISH, pid, b"\x32\x4e", payload(pid))  # room again after acks
    assert st2.pending() == [kept[-1], pid]


def test_a_full_outbox_still_takes_inbound_qos2_ids_and_meta():
    # With the outbox full of messages, an inbound QoS 2 message (in_add, in the session's receive path)
    # and the firmware's boot counter (set_meta, at every boot) used to fail with ENOSPC too: a reconnect
    # loop, or a board that boot-loops before it can drain anything. Messages leave room for them.
    dev = NorFlash(None, blocks=4)
    st = FlashStore(dev).open()
    pid = _fill(st)
    for i in range(1, 21):
        st.in_add(1000 + i)
        st.set_meta("boot", b"%d" % i)
    st2 = FlashStore(dev).open()
    assert st2.pending() == list(range(1, pid)) and st2.meta("boot") == b"20"
    assert all(st2.in_has(1000 + i) for i in range(1, 21))


def test_geometry_checked():
    raises(FlashCorrupt, FlashStore, NorFlash(None, blocks=2))


def test_group_commit_one_program_for_many_appends():
    dev = NorFlash(None, blocks=4)
    st = FlashStore(dev, group_commit=True, group_bytes=1024).open()
    st.append(PUBLISH, 1, b"\x32\x4e", payload(1))
    before = dev.programs
    for pid in range(2, 6):
        st.append(PUBLISH, pid, b"\x32\x4e", payload(pid))
    assert dev.programs == before  # staged in RAM, not yet durable
    assert FlashStore(dev).open().pending() == []
    st.commit()
    assert dev.programs == before + 1  # one program made them all durable
    assert FlashStore(dev).open().pending() == [1, 2, 3, 4, 5]
    st.append(PUBLISH, 6, b"\x32\x01", b"x")
    st.release(2)  # a release makes staged appends durable first
    st2 = FlashStore(dev).open()
    assert st2.pending() == [1, 3, 4, 5, 6] and read_all(st2, 6) == b"\x32\x01x"


def test_group_commit_stays_dirty_when_its_program_fails():
    """The write-ahead rule: a packet leaves only when `dirty` is False, so a
    group buffer whose program failed must still say dirty (a mark lost that
    way let its PUBREL leave: model seed 33). The store reads the flash again
    (lib/tern/store.py, "When storage fails"): the mark is not there, and it
    stays dirty, its epoch moved on, until the session has followed."""

    class Failing(NorFlash):
        fail = 0

        def writeblocks(self, block, buf, off=0):
            if self.fail:
                self.fail -= 1
                raise OSError(5, "EIO")
            return NorFlash.writeblocks(self, block, buf, off)

    dev = Failing(None, blocks=4)
    st = FlashStore(dev, append_acks=True, group_commit=True).open()
    st.append(PUBLISH, 1, b"\x34\x4e", payload(1))
    st.commit()
    st.mark(1)
    assert st.dirty
    dev.fail = 1
    try:
        st.commit()
        raise AssertionError("the failed program went unnoticed")
    except OSError:
        pass
    assert st.dirty and st.epoch != st.seen  # nothing announcing the mark may leave yet
    assert not st.marked(1) and not FlashStore(dev, append_acks=True).open().marked(1)
    st.commit()
    assert st.dirty  # until the session has followed what the store holds
    st.seen = st.epoch
    st.commit()
    assert not st.dirty
    st.mark(1)
    st.commit()
    assert not st.dirty
    assert FlashStore(dev, append_acks=True).open().marked(1)
    # a power cut tearing it: still dirty (the session's next packet raises instead of leaving)
    st.unmark(1)
    dev.cut_at = dev.ops + 1
    try:
        st.commit()
        raise AssertionError("no power cut")
    except PowerCut:
        pass
    assert st.dirty


def test_ram_per_pending_message():
    """The index costs at most 8 bytes per pending message (MicroPython heap)."""
    dev = NorFlash(None, blocks=64)
    st = FlashStore(dev).open()
    if MICROPYTHON:
        import gc

        gc.collect()
        a0 = gc.mem_alloc()
    n = 1024
    for pid in range(1, n + 1):
        st.append(PUBLISH, pid, b"\x32\x4e", payload(1))
    if MICROPYTHON:
        gc.collect()
        per = (gc.mem_alloc() - a0) / n
        assert per <= 8.5, per
    assert len(st._ipid) * (2 + 4 + 2) <= 8 * (n + 64)  # both runtimes: the arrays themselves
    assert st.pending() == list(range(1, n + 1))


def test_steady_path_allocates_nothing():
    dev = NorFlash(None, blocks=8)
    st = FlashStore(dev).open()
    head = bytearray(b"\x32\x4e")
    body = bytearray(payload(3))
    state = [0]

    def cycle():
        state[0] += 1
        pid = state[0] % 60000 + 1
        st.append(PUBLISH, pid, head, body)
        st.mark(pid)
        st.release(pid)

    sizes = [allocated(cycle) for _ in range(60)]
    if MICROPYTHON:
        # only a sector switch (one in ~39 messages) may allocate anything
        zero = sum(1 for s in sizes if s == 0)
        assert zero >= 54, sizes
    else:
        assert max(sizes) < 4096, sizes  # nothing sized by the data
    assert st.count() == 0


def fill_then_ack(blocks, bs, append_acks, seed):
    """Fill the store until it refuses appends, then do what a session does
    with a full outbox: PUBRECs (mark), a broker that lost the session
    (in_clear, unmark), PUBACKs (release). None of these may fail for lack of
    room, or a full outbox could never drain (or never connect again)."""
    dev = NorFlash(None, blocks=blocks, block_size=bs)
    st = FlashStore(dev, append_acks=append_acks, verbose=False).open()
    rng = Rng(seed)
    st.in_add(9)
    st.set_meta("boot", b"1")
    pid = refused = 0
    while refused < 3:
        pid += 1
        try:
            st.append(PUBLISH, pid, b"\x34\x4e", bytes(10 + rng.below(bs // 3)))
        except OSError as e:
            assert e.args[0] == 28, e.args
            refused += 1
    kept = st.pending()
    assert len(kept) >= 2, kept
    for q in kept[::2]:
        st.mark(q)
    st.in_clear()
    for q in kept[::2]:
        st.unmark(q)  # the broker forgot the PUBRECs
    for q in kept[1::3]:
        st.mark(q)
    st2 = FlashStore(dev, append_acks=append_acks, verbose=False).open()
    assert st2.pending() == kept and not st2.in_has(9) and st2.meta("boot") == b"1"
    assert [q for q in kept if st2.marked(q)] == kept[1::3], (seed, blocks, bs)
    for q in kept:
        st2.release(q)
    st2.append(PUBLISH, pid, b"\x32\x01", b"x")
    assert FlashStore(dev, append_acks=append_acks).open().pending() == [pid]


def test_full_store_still_takes_every_ack():
    for blocks, bs in ((3, 4096), (4, 1024), (6, 512)):
        for acks in (False, True):
            for seed in (4, 15, 21):
                fill_then_ack(blocks, bs, acks, seed)


def test_mark_unmark_cycles_keep_their_state():
    """A QoS 2 record whose PUBREC is seen and forgotten again and again (the
    broker keeps losing the session) reads back in its last state after every
    reboot, in both ack modes, and costs no copy while status bytes last."""
    for acks in (False, True):
        dev = NorFlash(None, blocks=4, block_size=1024)
        st = FlashStore(dev, append_acks=acks).open()
        st.append(PUBLISH, 7, b"\x34\x4e", payload(7))
        st.append(PUBLISH, 8, b"\x34\x4e", payload(8))
        for k, st in enumerate(_toggles(st, 7, 7, lambda: FlashStore(dev, append_acks=acks).open())):
            assert st.pending() == [7, 8] and st.marked(7) == (k % 2 == 0) and not st.marked(8), (acks, k)
            assert read_all(st, 7) == b"\x34\x4e" + payload(7)


def image(blocks, bs):
    dev = NorFlash(None, blocks=blocks, block_size=bs)
    st = FlashStore(dev).open()
    for pid in range(1, 120):
        st.append(PUBLISH, pid, b"\x32\x4e", payload(pid))
    return bytes(dev.mem)


def test_other_geometry_is_an_error_not_an_erase():
    """A partition written with one geometry and opened with another (a block
    size or a block count that changed in the config or the partition table)
    is refused with both geometries named; nothing on it is touched."""
    img = image(8, 4096)
    for blocks, bs in ((4, 8192), (16, 2048), (4, 4096), (12, 4096)):
        dev = NorFlash(None, blocks=blocks, block_size=bs)
        n = min(len(img), blocks * bs)
        dev.mem[0:n] = img[0:n]
        e = raises(FlashCorrupt, FlashStore(dev, verbose=False).open)
        assert "8 blocks of 4096" in str(e) and "%d blocks of %d" % (blocks, bs) in str(e), str(e)
        assert dev.programs == 0 and sum(dev.erase_counts) == 0
    dev = NorFlash(None, blocks=8, block_size=4096)
    dev.mem[:] = img
    assert FlashStore(dev).open().pending() == list(range(1, 120))
    # a later format's valid header (version 2, its CRC right) is named, not erased
    h = bytearray(img[0:24])
    h[4] = 2
    dev = NorFlash(None, blocks=8, block_size=4096)
    dev.mem[:] = img
    dev.mem[0:24] = h
    dev.mem[24:28] = (crc32(h) & 0xFFFFFFFF).to_bytes(4, "little")
    e = raises(FlashCorrupt, FlashStore(dev, verbose=False).open)
    assert "format 2" in str(e) and dev.programs == 0 and sum(dev.erase_counts) == 0, str(e)


def test_mark_toggled_on_a_copy_made_for_its_own_op_record():
    """The fourth mark/unmark of a record (its three mark bytes used up)
    appends an OP record; if the room for that OP is made by a reclaim that
    copies this very record forward, the copy has fresh mark bytes, and later
    toggles are programmed in place on it. An OP after that copy would
    override them at boot (the mark read back wrong: a PUBREL for a message
    the broker lost, or a PUBLISH again). Every toggle reads back after a
    reboot; the fill that makes the reclaim happen there is searched for."""
    hit = 0
    for nfill in range(36, 64):
        dev = NorFlash(None, blocks=4, block_size=1024)
        st = FlashStore(dev, verbose=False).open()
        st.append(PUBLISH, 1, b"\x34\x10", bytes(40))
        pid = 1
        for _ in range(nfill):
            pid += 1
            st.append(PUBLISH, pid, b"\x32\x10", bytes(30))
            if pid > 3:
                st.release(pid - 1)
        st.mark(1)
        st.unmark(1)
        st.mark(1)
        at = st._iaddr[st._find(1)] & ~7
        st.unmark(1)  # an OP record: no mark byte left
        if st._iaddr[st._find(1)] & ~7 == at:
            continue  # not copied by that OP's reclaim: not the case looked for
        hit += 1
        for k, st in enumerate(_toggles(st, 1, 4, lambda: FlashStore(dev, verbose=False).open())):
            assert st.marked(1) == (k % 2 == 0), (nfill, k)
            assert read_all(st, 1) == b"\x34\x10" + bytes(40)
    assert hit, "no fill made the OP's reclaim copy the record"


def test_inbound_ids_cannot_take_the_boot_counters_room():
    """With the outbox full, inbound QoS 2 ids (a broker holding PUBRELs) took
    all of the 640 bytes a message leaves free, and then the firmware's boot
    counter (set_meta at every boot, before connecting) failed with ENOSPC:
    a boot loop, never connecting, so the broker never released the ids. Ids
    are refused first; the boot counter keeps being written, growing too."""
    dev = NorFlash(None, blocks=4, block_size=4096)
    st = FlashStore(dev, verbose=False).open()
    st.set_meta("boot", b"1")
    pid = 0
    while True:
        pid += 1
        try:
            st.append(PUBLISH, pid, b"\x32\x4e", payload(pid, 60))
        except OSError as e:
            assert e.args[0] == 28, e.args
            break
    n = 0
    while True:
        try:
            st.in_add(1000 + n)
        except OSError as e:
            assert e.args[0] == 28, e.args
            break
        n += 1
    assert n >= 20, n
    for b in range(2, 12):  # "10": a longer value, a bigger record
        st.set_meta("boot", b"%d" % b)
        st = FlashStore(dev, verbose=False).open()
    st.set_meta("interval", b"60000 1000")
    st = FlashStore(dev, verbose=False).open()
    assert st.meta("boot") == b"11" and st.meta("interval") == b"60000 1000"
    assert st.pending() == list(range(1, pid)) and all(st.in_has(1000 + i) for i in range(n))


def test_index_is_reserved_at_start_for_max_pending():
    """The session asks its store for max_pending places at start; up to that many pending records
    (holes from out-of-order acks included) the index is never copied again. Grown late, in a long
    outage on a small heap, the copy found no free block: MemoryError at publish with 130 pending on
    the qemu-m3-tight board's 32 KiB heap."""
    from tern.session import Session

    st = FlashStore(NorFlash(None, blocks=16))
    Session("c", 4, False, store=st, max_pending=200)
    index = st._ipid
    assert len(index) >= 200
    for pid in range(1, 201):
        st.append(PUBLISH, pid, b"\x32\x4e", payload(pid, 20))
    for pid in range(1, 201, 2):
        st.release(pid)
    for pid in range(201, 301):
        st.append(PUBLISH, pid, b"\x32\x4e", payload(pid, 20))
    assert st._ipid is index
    st.append(PUBLISH, 301, b"\x32\x4e", payload(301, 20))  # past it, the index still grows
    assert st._ipid is not index
    assert st.pending() == list(range(2, 201, 2)) + list(range(201, 302))


def boot_index_workload(append_acks):
    """About 150 pending across a log that went round (relocated copies come back out of order at
    boot), acks out of order (holes), marks; then a store that reserved 200 places opens it: pending()
    and the marks come back in append order, in that same index (never copied while the boot scan
    fills it: a copy, or a dict of small lists spread between the scan's garbage, is what the
    qemu-m3-tight board's heap could not hold at boot over 160 pending: MemoryError at every boot)."""
    dev = NorFlash(None, blocks=8)
    st = FlashStore(dev, append_acks=append_acks).open()
    rng = Rng(11)
    live = []
    marked = set()
    pid = 0
    for i in range(1200):
        pid = pid % 60000 + 1
        st.append(PUBLISH, pid, b"\x32\x4e", payload(pid, 20))
        live.append(pid)
        if rng.below(4) == 0:
            st.mark(pid)
            marked.add(pid)
        while len(live) > 150 or (len(live) > 100 and rng.below(2)):
            q = live.pop(20 + rng.below(len(live) - 20))  # the first 20 stay: copied at each turn
            st.release(q)
            marked.discard(q)
    assert dev.counters()["erases_total"] >= 8, dev.counters()  # the log went round
    st2 = FlashStore(dev, append_acks=append_acks)
    st2.reserve(200)
    index = st2._ipid
    st2.open()
    assert st2._ipid is index
    assert st2.pending() == live
    assert [q for q in live if st2.marked(q)] == [q for q in live if q in marked]
    for q in live[::10]:
        assert read_all(st2, q) == b"\x32\x4e" + payload(q, 20)
    st3 = FlashStore(dev, append_acks=append_acks).open()  # no reserve(): grown during the scan
    assert st3.pending() == live
    assert [q for q in live if st3.marked(q)] == [q for q in live if q in marked]


def test_boot_builds_the_index_in_place():
    boot_index_workload(False)


def test_boot_builds_the_index_in_place_appended_acks():
    boot_index_workload(True)
