"""Manual acknowledgement (Session(manual_ack=True)), imported on first use: the queue of
acknowledgements in arrival order, [pid, ack type, reason code to send, or -1 until the app's
ack()]. Functions of the session (`s`), called from where they were its methods.
"""

from .wire import const

_CONNECTED = const(2)  # the session's state
_PUBACK = const(4)
_PUBREC = const(5)


def ack(s, ack_id, now):
    # Session.ack: mark the message done, then send the acknowledgements at
    # the head of the queue that are ready (arrival order is kept).
    q = s.inq
    pid = ack_id & 0xFFFF
    t = _PUBACK if ack_id >> 16 == 1 else _PUBREC
    for e in q:
        if e[0] == pid and e[2] < 0 and e[1] == t:
            e[2] = 0
            break
    while q and q[0][2] >= 0:
        pid, t, r = q.pop(0)
        if s.state != _CONNECTED:
            continue
        if t == _PUBREC and not s.inids.in_has(pid):
            s.store.in_add(pid)  # (durable before its PUBREC leaves: Session._out)
        s.send_ack(t, pid, r, now)


def lost(s):
    # The connection is gone: the queue was for it (the broker sends those
    # messages again). QoS 2 messages the app never acknowledged: counted, not recorded.
    for e in s.inq:
        if e[1] == _PUBREC and s.in2 and not s.inids.in_has(e[0]):
            s.in2 -= 1
    s.inq = []
