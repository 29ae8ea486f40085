"""What makes two QoS 2 copies the same message, and the collector's durable memory of the ones it landed.

One identity rule, used while the collector runs, in the record each landing file carries and in the
window rebuilt at start (:func:`identity`):

- a well-formed payload is the message the audit counts: its ``(device, boot, q, seq)`` -- the
  payload's own ``q``, not the QoS it was delivered with (:func:`message_key`);
- a malformed one has nothing else to go on: its topic and its bytes (:func:`payload_key`).

Both are 8-byte BLAKE2b digests under different personalisations, so a quarantined message and a
landed one never share a key.

Where each is used (see :mod:`.collect`): the *record* (packet id -> identity, in every landing file's
footer) recognises a broker's resend (DUP set, same packet id, same identity) of any message delivered
at QoS 2, malformed ones included; the *window* (the newest ``--qos2-window`` identities) recognises a
copy whatever its packet id and DUP flag, and holds well-formed messages whose payload says ``q: 2``
only -- a malformed payload sent again on purpose (a device's repeated status string) is a new message
each time, and nothing in its bytes can tell it from a resend.

The window survives restarts in :class:`.landing.WindowLog`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct

KEY_BYTES = 8
_ENTRY = struct.Struct(">H8s")  # a record entry: packet id, identity


def message_key(device: str, boot: int, qos: int, seq: int) -> bytes:
    """The identity of a well-formed message: the audit's key (device, boot, payload q, seq)."""
    text = json.dumps([device, boot, qos, seq])  # unambiguous; lone surrogates come out escaped
    return hashlib.blake2b(text.encode(), digest_size=KEY_BYTES, person=b"tern.message").digest()


def payload_key(topic: str, payload: bytes) -> bytes:
    """The identity of a malformed message: its topic and payload bytes."""
    return hashlib.blake2b(topic.encode("utf-8", "surrogatepass") + b"\0" + bytes(payload),
                           digest_size=KEY_BYTES, person=b"tern.malformed").digest()


def identity(topic: str, payload: bytes, parsed: dict | None) -> bytes:
    """:func:`message_key` of a parsed payload, :func:`payload_key` of one that did not parse."""
    if parsed is None:
        return payload_key(topic, payload)
    return message_key(parsed["device"], parsed["boot"], parsed["qos"], parsed["seq"])


def in_window(parsed: dict | None) -> bool:
    """Whether a message's identity goes into the window: a well-formed payload that says ``q: 2``."""
    return parsed is not None and parsed["qos"] == 2


def encode_record(record: dict) -> bytes:
    """``{packet id: identity}`` as the footer's ``tern.qos2`` value."""
    return base64.b64encode(b"".join(_ENTRY.pack(pid, key) for pid, key in record.items()))


def decode_record(text: bytes) -> dict:
    raw = base64.b64decode(text, validate=True)
    if len(raw) % _ENTRY.size:
        raise ValueError("truncated record")
    return {pid: key for pid, key in _ENTRY.iter_unpack(raw)}
