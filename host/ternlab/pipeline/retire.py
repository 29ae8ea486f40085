"""``tern collect --retire``: the end of a collector that is leaving for good -- when the broker has
nothing more for its session (:func:`drained`), and how the session is ended (:func:`end_session`).
Both take the :class:`.collect.Collector` as ``self``."""

from __future__ import annotations

import time


def drained(self) -> bool:
    """Retiring: has the broker nothing more for this session?

    Nothing arrived for ``--drain-idle`` seconds: what is held is written and acknowledged now.
    Then one more round trip (UNSUBSCRIBE again, answered by UNSUBACK): the broker handles a
    connection's packets in order, so by the UNSUBACK it has read every acknowledgement sent
    before -- including the PUBCOMPs that free in-flight slots -- and has already sent what they
    released. Nothing arrived before the UNSUBACK and nothing is held: drained."""
    c = self.client
    if not c.connected or time.monotonic() - self.last_activity < self.args.drain_idle:
        return False
    if self.unwritten:
        self.flush()
        self.last_activity = time.monotonic()
        return False
    seen = self.arrivals
    try:
        c.unsubscribe(self.filter)
    except OSError:
        return False  # lost: loop() reconnects, and the drain goes on
    self.last_activity = time.monotonic()
    return self.arrivals == seen and not self.unwritten and c.connected

def end_session(self) -> bool:
    """Retiring, drained: end the session at the broker so nothing more is kept for this id.
    MQTT 5: DISCONNECT with Session Expiry Interval 0. MQTT 3.x has no such property: a normal
    DISCONNECT, then a clean-session connect with the same id (which discards the old session)
    and its DISCONNECT (a clean session ends with its connection). True once it is ended."""
    a = self.args
    if not self.client.connected:  # lost at the last moment: the session stays, so may the rest
        self._disconnect()
        self.say("error: the connection was lost before the session could be ended; everything "
                 "received was landed; run --retire again")
        return False
    if a.version == 5:
        from tern import props as P

        self._disconnect(props={P.SESSION_EXPIRY_INTERVAL: 0})
        self.say("retired: the session ended at the broker (DISCONNECT, session expiry 0)")
        return True
    self._disconnect()
    from tern.client import Client

    c = Client(a.id, clean=True, reconnect=False, keepalive=a.keepalive, **self.conn)
    try:
        c.connect()
        c.disconnect()
    except OSError as e:
        self.say(f"error: everything was landed, but the final clean-session connect to end the "
                 f"session failed: {e}; run --retire again")
        return False
    self.say("retired: the session ended at the broker (clean-session connect and DISCONNECT)")
    return True

