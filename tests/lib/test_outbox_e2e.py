"""The client with FlashStore on emulated NOR flash against a real Mosquitto:
what publish() accepted before a reboot or a power cut reaches the
subscriber after it: every message at least once, QoS 2 exactly once, final
copies in publish order. The full sweep over every cut point is
tools/store_sweep.py; this runs a seeded sample on both runtimes."""

from check import Rng
from norflash import NorFlash, PowerCut
from pump import until
from storekit import tmppath, rm
from tern.client import Client
from tern.flashstore import FlashStore

MP_HEAPSIZE = "4m"
MP_TIMEOUT = 280
N = 24


def boot(path, addr, cut_at=0, seed=1):
    dev = NorFlash(path, blocks=8, block_size=4096, cut_at=cut_at, seed=seed)
    c = Client("outbox-device", server=addr[0], port=addr[1], version=4, clean=False,
               store=FlashStore(dev, verbose=False), window=1, backoff_min=0.02, backoff_max=0.1)
    return dev, c


def subscriber(addr, got):
    s = Client("outbox-watch", server=addr[0], port=addr[1], version=4, clean=False)
    s.on_message = lambda m: got.append((int(bytes(m.payload)), m.qos))
    s.connect()
    s.subscribe("ob/#", 2)
    return s


def check(got, accepted, where):
    seen = [p for p, _ in got]
    for i in accepted:
        assert i in seen, "%s: accepted message %d lost (got %r)" % (where, i, seen)
    for i in set(seen):
        if i % 2:  # odd messages are QoS 2
            assert seen.count(i) == 1, "%s: QoS 2 message %d delivered %d times" % (where, i, seen.count(i))
    last = {}
    for k, p in enumerate(seen):
        last[p] = k
    finals = sorted(last, key=lambda p: last[p])
    assert finals == sorted(finals), "%s: final copies out of order: %r" % (where, finals)


def test_offline_messages_survive_a_reboot(broker_addr):
    path = tmppath("e2e")
    got = []
    watch = subscriber(broker_addr, got)
    try:
        NorFlash(path, blocks=8, block_size=4096, fresh=True).close()
        dev, c = boot(path, broker_addr)
        pids = [c.publish("ob/x", b"%d" % i, qos=1 + i % 2) for i in range(N)]
        dev.close()  # reboot: nothing of the client survives but the flash
        dev, c = boot(path, broker_addr)
        assert c.session.pending() == pids, c.session.pending()
        assert c.session.stats_recovered == N
        c.connect()
        until([c, watch], lambda: len(got) >= N and not c.session.pending(), 20000, "offline messages")
        check(got, range(N), "after reboot")
        assert len(got) == N, got
        dev.close()
        dev, c = boot(path, broker_addr)
        assert c.session.pending() == [], "acknowledged messages came back after a reboot"
        dev.close()
    finally:
        rm(path)


def _workload(c, accepted, watch):
    for i in range(N):
        c.publish("ob/x", b"%d" % i, qos=1 + i % 2)
        accepted.append(i)
        c.loop(0)
        watch.loop(0)
    c.wait_all(20)


def test_power_cut_at_sampled_flash_operations(broker_addr):
    path = tmppath("e2e-cut")
    try:
        # a clean run tells how many flash operations the workload takes
        NorFlash(path, blocks=8, block_size=4096, fresh=True).close()
        got = []
        watch = subscriber(broker_addr, got)
        dev, c = boot(path, broker_addr)
        c.connect()
        _workload(c, [], watch)
        total = dev.ops
        dev.close()
        until([watch], lambda: len(got) >= N, 10000, "clean run")
        rng = Rng(7)
        cuts = sorted(set(1 + rng.below(total) for _ in range(8)))
        for k in cuts:
            where = "cut at flash operation %d of %d" % (k, total)
            NorFlash(path, blocks=8, block_size=4096, fresh=True).close()
            del got[:]
            dev, c = boot(path, broker_addr, cut_at=k, seed=k)
            accepted = []
            try:
                c.connect()
                _workload(c, accepted, watch)
            except PowerCut:
                pass
            assert dev.dead, where + ": the cut never happened"
            c.close()
            dev, c = boot(path, broker_addr)  # power back: same client id, the store re-opened
            c.connect()
            c.wait_all(20)
            until([c, watch], lambda: all(i in [p for p, _ in got] for i in accepted), 20000, where)
            watch.loop(200)
            check(got, accepted, where)
            dev.close()
    finally:
        rm(path)
