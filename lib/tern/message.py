"""The inbound message handed to handlers: one preallocated object per session,
refilled for every PUBLISH, pointing into the receive buffer.

Reading `topic`, `payload` or `properties` builds a Python object (a str, a
memoryview, a dict) only when a handler asks for it; a handler that needs the
message after it returns must copy what it needs (`bytes(msg.payload)`).
"""

from array import array


class Message:
    def __init__(self, n_ids=4):
        self.buf = None  # the receive buffer the offsets refer to
        self.tbuf = None  # where the topic is (the receive buffer, or an alias entry)
        self.topic_start = self.topic_end = 0
        self.props_start = self.props_end = 0
        self.payload_start = self.payload_end = 0
        self.qos = self.retain = self.dup = self.pid = 0
        self.alias = self.n_sub_ids = self.pfi = 0
        self.sub_ids = array("I", [0] * n_ids)
        self.version = 4

    @property
    def topic(self):
        return str(memoryview(self.tbuf)[self.topic_start : self.topic_end], "utf-8")

    @property
    def payload(self):
        """A memoryview into the receive buffer: valid until the handler returns."""
        return memoryview(self.buf)[self.payload_start : self.payload_end]

    @property
    def properties(self):
        """MQTT 5 properties as a dict {identifier: value} (None when there are none)."""
        if self.props_end == self.props_start:
            return None  # (without loading tern.props)
        from .props import of_message

        return of_message(self)

    @property
    def ack_id(self):
        """What `Client.ack()` takes in manual-acknowledgement mode."""
        return self.qos << 16 | self.pid

    def __repr__(self):
        return "Message(topic=%r, qos=%d, retain=%d, dup=%d, pid=%d, payload=%r)" % (
            self.topic, self.qos, self.retain, self.dup, self.pid, bytes(self.payload))
