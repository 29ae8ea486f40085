"""The Session's public numbers: the kinds of on_event(kind, a, b), the connection states and
publish()'s WOULD_BLOCK, for code that spells them out (drivers of the sans-I/O Session,
host tools, tests).

`tern.session` folds them into its bytecode as private constants and serves these names as its
own attributes (`from tern.session import EV_PUBLISHED`), importing this module only when one is
first asked for: as module globals they filled its dictionary's table, and every name the
session's functions look up there and miss (each builtin: `len`, `isinstance`) probed every slot,
on every message. tests/lib/test_constants.py checks the copies agree.
"""

from .wire import const

# The connection's states (tern.session: CONNECTING is private).
DISCONNECTED = const(0)
CONNECTED = const(2)

# Events for on_event(kind, a, b).
EV_CONNACK = const(1)  # a = session present, b = CONNACK Packet
EV_PUBLISHED = const(2)  # a = pid, b = reason (acknowledged, or refused when >= 0x80)
EV_SUBACK = const(3)  # a = pid, b = list of reason codes
EV_UNSUBACK = const(4)  # a = pid, b = list of reason codes
EV_DISCONNECT = const(5)  # a = reason code, b = DISCONNECT Packet
EV_AUTH = const(7)  # a = 0: a re-authentication succeeded, b = AUTH Packet
EV_LOST = const(8)  # a = 0, b = the OSError: a send under publish() failed, the connection is over

WOULD_BLOCK = const(-1)  # publish(): ordering holds the message back; try again after loop()
