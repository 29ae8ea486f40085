"""`-d` of `tern pub` / `tern sub`: every packet sent and received, one line
each in libmosquitto's words (the tests compare the lines with mosquitto's
`-d`). Fixed headers, variable byte integers and packet names come from the
library (tern.wire, tern.codec); this module only words them.

A CONNECT's body is never kept or looked at, so user names and passwords
cannot reach the trace."""

from tern.codec import packet_name
from tern.wire import (AUTH, CONNACK, CONNECT, DISCONNECT, PINGREQ, PINGRESP, PUBACK, PUBCOMP, PUBLISH, PUBREL,
                       SUBACK, SUBSCRIBE, UNSUBACK, UNSUBSCRIBE, MQTTError, get_varint, varint_size)


def _after_varint(b, i):
    """The index after the property block whose length (a variable byte
    integer) starts at b[i]; IndexError when b ends first."""
    n = get_varint(b, i, len(b))
    if n < 0:
        raise IndexError("cut inside a variable byte integer")
    return i + varint_size(n) + n


class Tracer:
    """Cuts one direction of an MQTT byte stream into packets and describes
    each in one line. A CONNECT's body is never kept or looked at, so user
    names and passwords cannot reach the trace."""

    KEEP = 1024  # body bytes kept per packet: enough for topics and ids

    def __init__(self, say, verb, version, subscribed=None):
        self.say = say
        self.verb = verb
        self.version = version
        self.subscribed = subscribed  # subscribed(line) after a SUBACK's own line
        self.reset()

    def reset(self):
        self.hdr = bytearray()
        self.body = bytearray()
        self.left = -1
        self.total = 0

    def feed(self, data):
        i = 0
        n = len(data)
        while i < n:
            if self.left < 0:
                self.hdr.append(data[i])
                i += 1
                if len(self.hdr) < 2:
                    continue
                try:
                    rl = get_varint(self.hdr, 1, len(self.hdr))
                except MQTTError:
                    self.say("%s a malformed fixed header" % self.verb)
                    self.reset()
                    continue
                if rl >= 0:
                    self.total = self.left = rl
                    if not self.left:
                        self._done()
                continue
            k = min(self.left, n - i)
            room = 0 if self.hdr[0] >> 4 == CONNECT else self.KEEP - len(self.body)
            if room > 0:
                self.body += bytes(data[i : i + min(k, room)])
            i += k
            self.left -= k
            if not self.left:
                self._done()

    def _done(self):
        t = self.hdr[0] >> 4
        flags = self.hdr[0] & 15
        try:
            desc = self.describe(t, flags, self.body, self.total)
        except (IndexError, ValueError, UnicodeError, MQTTError):
            desc = "%s (%d bytes)" % (packet_name(t), self.total)
        self.say("%s %s" % (self.verb, desc))
        if t == SUBACK and self.subscribed:  # as mosquitto_sub -d: "Subscribed (mid: 1): 0, 1"
            b = self.body
            try:
                i = self._props_end(b, 2)
                self.subscribed("Subscribed (mid: %d): %s" % (
                    b[0] << 8 | b[1], ", ".join(str(c) for c in b[i : self.total])))
            except (IndexError, ValueError, MQTTError):
                pass
        self.reset()

    def _props_end(self, b, i):
        if self.version != 5:
            return i
        return _after_varint(b, i)

    def describe(self, t, flags, b, total):
        name = packet_name(t)
        if t in (CONNECT, PINGREQ, PINGRESP):
            return name
        if t == CONNACK:
            return "%s (%d)" % (name, b[1])
        if t == PUBLISH:
            q = flags >> 1 & 3
            tl = b[0] << 8 | b[1]
            topic = bytes(b[2 : 2 + tl]).decode("utf-8", "replace")
            if tl > len(b) - 2:
                topic += "..."
            i = 2 + tl
            mid = 0
            if q:
                mid = b[i] << 8 | b[i + 1]
                i += 2
            if self.version == 5:
                if i < len(b):
                    i = _after_varint(b, i)
            return "%s (d%d, q%d, r%d, m%d, '%s', ... (%d bytes))" % (
                name, flags >> 3 & 1, q, flags & 1, mid, topic, total - i)
        if PUBACK <= t <= PUBCOMP:  # as libmosquitto words them
            mid = b[0] << 8 | b[1]
            rc = b[2] if total >= 3 else 0
            if self.verb == "sending":
                return "%s (m%d, rc%d)" % (name, mid, rc) if t < PUBREL else "%s (m%d)" % (name, mid)
            if t in (PUBACK, PUBCOMP):
                return "%s (Mid: %d, RC:%d)" % (name, mid, rc)
            return "%s (Mid: %d)" % (name, mid)
        if t in (SUBSCRIBE, UNSUBSCRIBE):
            mid = b[0] << 8 | b[1]
            i = self._props_end(b, 2)
            out = []
            while i + 2 <= len(b):
                tl = b[i] << 8 | b[i + 1]
                flt = bytes(b[i + 2 : i + 2 + tl]).decode("utf-8", "replace")
                i += 2 + tl
                if t == SUBSCRIBE:
                    o = b[i]
                    i += 1
                    out.append("Topic: %s, QoS: %d, Options: 0x%02X" % (flt, o & 3, o & 0xFC))
                else:
                    out.append("Topic: %s" % flt)
            return "%s (Mid: %d, %s)" % (name, mid, "; ".join(out))
        if t in (SUBACK, UNSUBACK):  #: no codes (a SUBACK's get a line of their own, see _done)
            return name
        if t in (DISCONNECT, AUTH):
            return "%s (%d)" % (name, b[0]) if total else name
        return name


def hook_trace(client, say):
    s = client.session
    out = Tracer(lambda m: say("Client %s %s" % (s.client_id or "(null)", m)), "sending", s.version)
    inn = Tracer(lambda m: say("Client %s %s" % (s.client_id or "(null)", m)), "received", s.version, say)
    send = s.send
    feed_n = s.feed_n
    connect = client.connect

    def traced_send(buf, off, n):
        send(buf, off, n)
        out.feed(memoryview(buf)[off : off + n])

    def traced_feed_n(n, now):
        inn.feed(memoryview(s.rx)[s.rx_len : s.rx_len + n])
        feed_n(n, now)

    def traced_connect(*a, **k):
        out.reset()
        inn.reset()
        return connect(*a, **k)

    s.send = traced_send
    s.feed_n = traced_feed_n
    client.connect = traced_connect
