"""The write-ahead rule at the packet (issue 25): a packet that announces a
store change leaves only once that change is durable, in every store mode.

A power cut right after the packet left, then a reboot from what is durable
(every byte written and not synced is lost: the worst a cut may leave; a
FlashStore's group buffer is RAM), must find the state the packet announced:
- PUBREL announces the mark (PUBREC seen): after the reboot the session goes
  on with PUBREL, never the PUBLISH again (the broker released that id once
  and would deliver a resent PUBLISH as a new message: QoS 2 twice);
- PUBCOMP announces the release of an inbound id: the broker may send its next
  QoS 2 message under that id, and the client must deliver it, not take it
  for a repeat;
- PUBREC announces the inbound id, SUBSCRIBE / UNSUBSCRIBE their records.
"""

from tern.codec import Packet, encode
from tern.session import Session
from tests.lib import kit
from tests.lib.kit import FileRig, FlashRig, MemRig


# -- stores that lose power right after a packet (the test kit's rigs) ------------------------
def rigs():
    return [
        ("FlashStore in place, group commit", FlashRig(group_commit=True)),
        ("FlashStore append_acks, group commit", FlashRig(append_acks=True, group_commit=True)),
        ("FlashStore append_acks", FlashRig(append_acks=True)),
        ("FlashStore in place", FlashRig()),
        ("FileStore, group commit", FileRig(group_commit=True)),
        ("FileStore", FileRig()),
        ("MemoryStore", MemRig()),
    ]


def cut(rig):
    """The power goes now (every byte written and not synced is lost; a FlashStore's group buffer
    is RAM; a MemoryStore keeps its RAM: a restart of the session only); the store after the reboot."""
    rig.cut_now(exact=True)
    return rig.reboot()


# -- a session on the wire ---------------------------------------------------------------
class Wire(kit.Wire):
    """A session on a store whose packets are decoded as they leave, with helpers to answer it."""

    def __init__(self, st, v=4):
        self.got = []
        s = self.s = Session("wal", v, False, store=st, window=4)
        s.on_message = lambda m: self.got.append(bytes(m.payload))
        kit.Wire.__init__(self, s)

    def feed(self, p):
        self.s.feed(encode(p, self.v), 0)

    def connect(self, sp):
        self.s.connect_packet(0)
        self.feed(Packet(2, session_present=sp))


def each_rig(f):
    for name, rig in rigs():
        try:
            f(name, rig)
        finally:
            rig.cleanup()


# -- the defects of issue 25 ------------------------------------------------------------
def test_pubrel_leaves_after_its_mark_is_durable():
    """Defect 1: a cut right after PUBREL; the next connection sends PUBREL, not the PUBLISH."""

    def one(name, rig):
        w = Wire(rig.boot())
        w.connect(False)
        pid = w.s.publish("t", b"once", 2, False, 0)
        assert w.take_types()[-1] == (3, pid), name
        w.feed(Packet(5, pid=pid))  # PUBREC
        assert w.take_types() == [(6, pid)], name
        w = Wire(cut(rig))  # power cut right after the PUBREL left
        w.connect(True)
        sent = w.take_types()
        assert sent[1:] == [(6, pid)], "%s: after the cut the session sent %r, not PUBREL %d" % (name, sent, pid)

    each_rig(one)


def test_pubcomp_leaves_after_the_release_is_durable():
    """Defect 2: a cut right after PUBCOMP; the broker's next QoS 2 message under that id is delivered."""

    def one(name, rig):
        w = Wire(rig.boot())
        w.connect(False)
        w.feed(Packet(3, topic="i", payload=b"first", qos=2, pid=7))
        assert w.got == [b"first"] and w.take_types() == [(1, 0), (5, 7)], name
        w.feed(Packet(6, pid=7))  # PUBREL
        assert w.take_types() == [(7, 7)], name
        w = Wire(cut(rig))  # power cut right after the PUBCOMP left
        w.connect(True)
        w.feed(Packet(3, topic="i", payload=b"second", qos=2, pid=7))  # the id, free again, reused
        assert w.got == [b"second"], "%s: the next message under id 7 was taken for a repeat" % name

    each_rig(one)


def test_pubrec_and_subscribe_leave_after_their_records():
    """PUBREC after the inbound id, SUBSCRIBE and UNSUBSCRIBE after their records: a cut right after
    each, and the repeat is answered without a second delivery / the request is resent."""

    def one(name, rig):
        w = Wire(rig.boot())
        w.connect(False)
        w.feed(Packet(3, topic="i", payload=b"m", qos=2, pid=9))
        assert w.take_types()[-1] == (5, 9), name
        w = Wire(cut(rig))
        w.connect(True)
        w.take_types()
        w.feed(Packet(3, topic="i", payload=b"m", qos=2, pid=9, dup=True))
        assert w.got == [] and w.take_types() == [(5, 9)], "%s: a repeat after PUBREC delivered again" % name
        sp = w.s.subscribe("a/b", 1, 0)
        up = w.s.unsubscribe("c", 0)
        assert w.take_types() == [(8, sp), (10, up)], name
        if isinstance(rig, MemRig):
            return
        w = Wire(cut(rig))
        assert w.s.pending() == [sp, up], "%s: SUBSCRIBE/UNSUBSCRIBE sent, their records lost" % name

    each_rig(one)


def test_in_clear_is_durable_once_the_connack_is_handled():
    """A CONNACK without our session clears the inbound ids: the broker's new session already exists,
    so a cut right after it must not bring them back (the broker's next message under such an id would
    be taken for a repeat and lost)."""

    def one(name, rig):
        if isinstance(rig, MemRig):
            return
        w = Wire(rig.boot())
        w.connect(False)
        w.feed(Packet(3, topic="i", payload=b"m", qos=2, pid=4))
        w = Wire(cut(rig))
        assert w.s.store.in_has(4), name
        w.connect(False)  # the broker lost our session
        w = Wire(cut(rig))
        w.connect(True)
        w.feed(Packet(3, topic="i", payload=b"new", qos=2, pid=4))
        assert w.got == [b"new"], "%s: the cleared id came back after the cut" % name

    each_rig(one)


def test_close_commits_what_is_buffered():
    """Session.disconnect (what Client.close and a deep sleep come through) leaves nothing in the group buffer."""

    def one(name, rig):
        w = Wire(rig.boot())
        w.connect(False)
        pid = w.s.publish("t", b"x", 1, False, 0)
        w.feed(Packet(4, pid=pid))  # PUBACK: the release waits for a commit under group commit
        w.s.disconnect(0)
        if isinstance(rig, MemRig):
            return
        assert cut(rig).pending() == [], "%s: the release was lost at disconnect" % name

    each_rig(one)


def test_client_close_commits_what_is_buffered():
    """Client.close() and tern.aio's close() (the firmware's way to deep sleep and reboot) leave nothing
    waiting in a group-commit store: a change made just before (here an inbound id, as a message's
    handling would make) is found after a power cut right after."""
    from tern.client import Client
    import tern.aio

    for make in (Client, tern.aio.Client):
        for name, rig in rigs():
            try:
                if isinstance(rig, MemRig):
                    continue
                st = rig.boot()
                c = make("wal", "127.0.0.1", 9, store=st, reconnect=False)
                st.in_add(5)
                c.close()
                assert cut(rig).in_has(5), "%s: %s.close() left the change uncommitted" % (name, make.__module__)
            finally:
                rig.cleanup()
