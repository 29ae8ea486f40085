"""``tern collect``: land device telemetry durably, acknowledging each message only once it is on disk.

How it keeps "nothing lost":

- It joins a shared subscription ``$share/<group>/<topic>`` with the CPython Tern client in manual
  acknowledgement mode, on a persistent session (clean start off, a session expiry under MQTT 5) with a
  stable client id (``--id``). The broker holds every QoS 1/2 message it sent until the PUBACK (QoS 1)
  or PUBREC (QoS 2) arrives, and sends it again when the same id reconnects.
- Messages are batched (by count, payload bytes and age). A batch is written as Parquet landing files
  (see :mod:`.landing`: temp file, fsync, rename, directory fsync); only then are its messages
  acknowledged, in the order they arrived. A collector killed at any moment has acknowledged only what
  is durable; the rest comes back when it restarts with the same ``--id``.
- If the batch cannot be written (disk full, unwritable directory), the collector prints one error
  line, acknowledges nothing of that batch, disconnects (the session, and the messages, stay at the
  broker) and exits with status 1.
- Payloads :func:`.schema.parse_payload` rejects go to the quarantine partition with their raw bytes
  and the reason, and are acknowledged like the rest.
- A lost connection: messages of the old connection that are not yet written can no longer be
  acknowledged. They are kept; when the broker sends one again (it should: the session is persistent)
  the new copy replaces it and is acknowledged once written; the ones it does not send again within
  ``--batch-time`` (a broker that crashed before saving them) are written unacknowledged. So a broker
  crash costs no message and, when the broker did keep them, no duplicate.
- SIGTERM / SIGINT: the current batch is written and acknowledged, then the collector disconnects
  cleanly (the session stays) and exits 0.
- QoS 2 exactly once, across a kill too: every landing file carries the record of the QoS 2 messages
  landed and not yet released by the broker (packet id + checksum of topic and payload, see
  :mod:`.landing`), committed by the same rename as the rows. At start the collector reads it back from
  its newest file; a resend (DUP set) with a recorded packet id and the same checksum is acknowledged
  (PUBREC, then PUBCOMP on the PUBREL) and not landed again (``qos2_already_landed``). A PUBREL tells
  it the broker has the PUBREC (the entry is dropped), as does another message under that packet id.
  QoS 1 has no such release: a kill between a file's rename and its PUBACKs still gives duplicates.
- QoS 2 exactly once, whatever the broker sends: a copy is also recognised by what it is -- the
  reading's topic, device, boot and sequence number (:func:`.landing.reading_key`; topic and payload
  for a malformed one) -- against a window of the newest ``--qos2-window`` QoS 2 messages landed or
  held (rebuilt from this collector's newest landing files at start). A copy in the window is
  acknowledged and not landed (``qos2_already_landed``), with or without DUP, under any packet id:
  a broker restarted (hard or soft) may send a message again after our PUBREC or even after the
  PUBCOMP (it saved its state before them), and a broker that lost its state gets the device's own
  resend of a message it had already delivered. A resend that reaches *another* collector of the
  group is not seen here (each collector knows its own window); the audit counts it.
- ``--retire``: connect as ``--id`` (its persistent session), unsubscribe the shared subscription, land
  and acknowledge what the broker still holds for it until nothing comes for ``--drain-idle`` seconds
  and one UNSUBSCRIBE round trip confirms it, then end the session (MQTT 5: DISCONNECT with session
  expiry 0; 3.x: a clean-session connect).

Broker side (Mosquitto): a shared subscription keeps sending to a member whose persistent session is
offline; those messages wait for that member's return. Restart a dead collector with the same ``--id``,
or retire it with ``--retire``; a session left to expire takes its messages with it. See
docs/pipeline.md.

Test-only fault injection: ``TERN_COLLECT_FAULT=kill-after-commit:N`` (or ``kill-after-ack:N``) makes
the collector SIGKILL itself right after its N-th batch is renamed (or just after its acknowledgements
went out); the tests use it to hit those crash windows exactly. Never set it in production.

The command's options and their checks are in :mod:`.collect_cli`.

``recv_idx`` is ``<microseconds since the epoch at start> + <arrival number>``: strictly increasing in
arrival order for one collector, across its restarts too (as long as its clock does not go back).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

from . import schema
from collections import OrderedDict

from .landing import LandingError, LandingWriter, qos2_key, reading_key

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class CollectError(Exception):
    """The collector cannot go on; the message is one line."""


class Batch:
    """Messages received and not yet durable, in arrival order, as column lists (``_idx``: arrival
    number, which names the files; ``_raw``: each landing row's payload, to recognise a resend;
    ``_q2``: ``(packet id, qos2_key)`` of a QoS 2 message, None otherwise, for the landing record)."""

    def __init__(self):
        self.rows = {n: [] for n in (*schema.LANDING_FIELDS, "_raw", "_q2")}
        self.rows["_idx"] = self.rows["recv_idx"]
        self.quarantine = {n: [] for n in (*schema.QUARANTINE_FIELDS, "_idx", "_q2")}
        self.acks = []         # ack_id per QoS 1/2 message, arrival order
        self.count = 0         # messages (landing + quarantine)
        self.nbytes = 0        # payload bytes
        self.first_at = None   # monotonic time of the oldest message

    def keys(self) -> dict:
        """``{(topic, payload): copies}`` of what the batch holds."""
        out: dict = {}
        for k in zip(self.rows["topic"], self.rows["_raw"]):
            out[k] = out.get(k, 0) + 1
        for k in zip(self.quarantine["topic"], self.quarantine["payload_raw"]):
            out[k] = out.get(k, 0) + 1
        return out

    def remove(self, topic: str, raw: bytes) -> None:
        """Drop the first message with this topic and payload."""
        for cols, rawcol in ((self.rows, "_raw"), (self.quarantine, "payload_raw")):
            for i, (t, r) in enumerate(zip(cols["topic"], cols[rawcol])):
                if t == topic and r == raw:
                    for k, v in cols.items():
                        if cols is not self.rows or k != "_idx":
                            del v[i]
                    self.count -= 1
                    self.nbytes -= len(raw)
                    return

    def merged(self, later: "Batch") -> tuple[dict, dict]:
        """Columns of this batch followed by ``later``'s (arrival order is kept)."""
        return ({k: v + later.rows[k] for k, v in self.rows.items()},
                {k: v + later.quarantine[k] for k, v in self.quarantine.items()})


def _release_store(collector):
    """The client's (in-memory) session store, telling ``collector`` what the broker did with the
    inbound QoS 2 messages: a PUBREL releases one (the broker has our PUBREC: it will not send that
    PUBLISH again), a connection without session present forgets them all (nothing comes again).
    Uses only the store contract of :mod:`tern.store` (``in_release``, ``in_clear``)."""
    from tern.store import MemoryStore

    class ReleaseStore(MemoryStore):
        def in_release(self, pid):
            MemoryStore.in_release(self, pid)
            collector.landed_q2.pop(pid, None)

        def in_clear(self):
            MemoryStore.in_clear(self)
            collector.landed_q2.clear()

    return ReleaseStore()


class Collector:
    """One collector process: the client, the batch, the writer, and the counters."""

    def __init__(self, args, out=sys.stdout):
        from tern.client import Client

        self.args = args
        self.out = out
        self.writer = LandingWriter(args.landing, args.id)
        self.filter = f"$share/{args.group}/{args.topic}"
        self.idx = time.time_ns() // 1000
        self.epoch = 0
        self.batch = Batch()
        self.orphans = Batch()     # received on an earlier connection, not written: cannot be acked
        self.orphan_keys: dict = {}
        self.stop_reason = None
        self.resubscribe = False
        self.arrivals = 0                     # messages received, all kinds (retire: the drain)
        self.last_activity = time.monotonic()  # last arrival or write (retire: idle since)
        self.retired = False
        self.fault = getattr(args, "fault", None)
        self.stats = {"landed": 0, "quarantined": 0, "acked": 0, "redelivered": 0, "resent_matched": 0,
                      "written_unacked": 0, "qos2_already_landed": 0, "batches": 0}
        # QoS 2 messages landed that the broker may still send again: {packet id: qos2_key}. Read
        # back from the newest landing file at start, carried in every file written, and emptied as
        # the broker releases them (PUBREL), reuses their packet id, or forgets the session.
        self.landed_q2: dict = {}
        # What the newest QoS 2 messages landed or held are (reading_key / qos2_key), oldest first,
        # at most --qos2-window of them: a copy found here is not landed again.
        self.q2_seen: OrderedDict = OrderedDict()
        opts = {"manual_ack": True, "store": _release_store(self)}
        if args.version == 5:
            opts["session_expiry"] = args.session_expiry
            from tern import props as P
            opts["connect_props"] = {P.RECEIVE_MAXIMUM: args.receive_max}
        # where and who: also what a retiring collector's final clean connect (MQTT 3.x) needs
        self.conn = {"server": args.host, "port": args.port, "version": args.version, "ssl": args.ssl}
        if args.username is not None:
            self.conn.update(username=args.username, password=args.password_bytes)
        self.client = Client(args.id, keepalive=args.keepalive, clean=False, backoff_min=0.1,
                             backoff_max=5, **self.conn, **opts)
        self.client.on_message = self._on_message
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect

    def say(self, text: str) -> None:
        print(f"tern collect [{self.args.id}]: {text}", file=self.out, flush=True)

    # --- callbacks (inside client.loop) --------------------------------------------------------

    def _on_connect(self, session_present, reason):
        self.epoch += 1
        # Subscribe again after every reconnect, even with session present: Mosquitto 2.0 forgets a
        # persistent session's *shared* subscriptions across its restart while keeping the session.
        self.resubscribe = self.epoch > 1
        b = self.batch
        if b.count:
            # Their acknowledgements can no longer be sent. The broker normally sends them again
            # (session present); but a broker that crashed may have lost them while we hold them. So
            # they are kept (orphans), a resend of one replaces it (and is acknowledged), and the
            # rest is written without an acknowledgement: at least once, never lost.
            o = self.orphans
            for cols, ocols in ((b.rows, o.rows), (b.quarantine, o.quarantine)):
                for k, v in cols.items():
                    if ocols is not o.rows or k != "_idx":
                        ocols[k].extend(v)
            o.count += b.count
            o.nbytes += b.nbytes
            o.first_at = time.monotonic()
            self.orphan_keys = o.keys()
            self.batch = Batch()
            self.say(f"reconnected (session present: {int(bool(session_present))}): {b.count} "
                     "unwritten message(s) of the old connection kept until the broker sends them "
                     "again; those it does not send again are written unacknowledged")
        elif self.epoch > 1:
            self.say(f"reconnected (session present: {int(bool(session_present))})")

    def _on_disconnect(self, err):
        self.say(f"connection lost: {err}; reconnecting")

    def _on_message(self, m):
        raw = bytes(m.payload)
        now = time.time()
        self.arrivals += 1
        self.last_activity = time.monotonic()
        b = self.batch
        if m.dup:
            self.stats["redelivered"] += 1
        q2 = None
        if m.qos:
            pid = m.pid
            q2 = (pid, qos2_key(m.topic, raw)) if m.qos == 2 else None
            known = self.landed_q2.get(pid)
            if known is not None:
                if m.dup and q2 is not None and q2[1] == known:
                    # A resend of a QoS 2 message already in a landing file (the PUBREC was lost
                    # with a killed collector or a broken connection): answer it, do not land it.
                    # The PUBREC leaves in arrival order; the PUBREL that follows is completed.
                    self.stats["qos2_already_landed"] += 1
                    self.client.ack(m.ack_id)
                    return
                # another message under that packet id: the broker had released the landed one
                del self.landed_q2[pid]
        try:
            p = schema.parse_payload(raw)
        except ValueError as e:
            p, bad = None, e
        orphan = self.orphan_keys and self.orphan_keys.get((m.topic, raw))
        if m.qos == 2 and not orphan:
            ident = qos2_key(m.topic, raw) if p is None else reading_key(m.topic, p["device"], p["boot"], p["seq"])
            if ident in self.q2_seen:
                # the same reading, landed (or held in this batch) already: a resend after a broker
                # restart, or the device's own after the broker lost it. Answered, not landed.
                self.stats["qos2_already_landed"] += 1
                self.client.ack(m.ack_id)
                return
            self._seen(ident)
        self.idx += 1
        if self.orphan_keys:
            key = (m.topic, raw)
            n = self.orphan_keys.get(key)
            if n:  # the resend of a message we held from the old connection: keep this copy only
                self.orphans.remove(*key)
                self.stats["resent_matched"] += 1
                if n == 1:
                    del self.orphan_keys[key]
                else:
                    self.orphan_keys[key] = n - 1
        if p is None:
            q = b.quarantine
            q["payload_raw"].append(raw)
            q["reason"].append(str(bad))
            q["recv_ts"].append(now)
            q["topic"].append(m.topic)
            q["collector"].append(self.args.id)
            q["_idx"].append(self.idx)
            q["_q2"].append(q2)
        else:
            r = b.rows
            r["device"].append(p["device"])
            r["boot"].append(p["boot"])
            r["seq"].append(p["seq"])
            r["qos"].append(p["qos"])
            r["topic"].append(m.topic)
            r["sent_ts"].append(p["sent_ts"])
            r["recv_ts"].append(now)
            r["recv_idx"].append(self.idx)
            r["collector"].append(self.args.id)
            r["readings"].append(list(p["readings"].items()))
            r["payload_raw"].append(raw if self.args.keep_raw else None)
            r["_raw"].append(raw)
            r["_q2"].append(q2)
        if m.qos:
            b.acks.append(m.ack_id)
        b.count += 1
        b.nbytes += len(raw)
        if b.first_at is None:
            b.first_at = time.monotonic()

    def _seen(self, ident: bytes) -> None:
        """Remember a QoS 2 message's identity; the oldest leaves once the window is full."""
        seen = self.q2_seen
        seen[ident] = None
        if len(seen) > self.args.qos2_window:
            seen.popitem(last=False)

    # --- the loop -------------------------------------------------------------------------------

    def _due(self) -> bool:
        a = self.args
        now = time.monotonic()
        o = self.orphans
        if o.count and now - o.first_at >= a.batch_time:
            return True
        b = self.batch
        if not b.count or not self.client.connected:
            return False  # while offline the batch waits: at reconnection it becomes orphans
        return (b.count >= a.batch_size or b.nbytes >= a.batch_bytes
                or now - b.first_at >= a.batch_time)

    @property
    def unwritten(self) -> int:
        return self.batch.count + self.orphans.count

    def flush(self) -> None:
        """Write the batch (and any orphans) durably, then acknowledge the batch's messages in
        arrival order; orphans (from an earlier connection) cannot be acknowledged."""
        b, o = self.batch, self.orphans
        if not b.count and not o.count:
            return
        rows, quarantine = o.merged(b) if o.count else (b.rows, b.quarantine)
        # raises LandingError: nothing acknowledged
        self.landed_q2 = self.writer.commit(rows, quarantine, self.landed_q2)
        self.batch, self.orphans, self.orphan_keys = Batch(), Batch(), {}
        self.stats["landed"] += len(rows["recv_ts"])
        self.stats["quarantined"] += len(quarantine["recv_ts"])
        self.stats["written_unacked"] += o.count
        self.stats["batches"] += 1
        self._fault("commit")
        client = self.client
        for k, ack_id in enumerate(b.acks):
            if not client.connected:
                self.stats["written_unacked"] += len(b.acks) - k
                break
            try:
                client.ack(ack_id)
            except OSError:  # the connection broke: loop() notices; the broker sends the rest again
                self.stats["written_unacked"] += len(b.acks) - k
                break
            self.stats["acked"] += 1
        self._fault("ack")

    def _fault(self, point: str) -> None:
        """Test-only fault injection: ``TERN_COLLECT_FAULT=kill-after-commit:N`` (or
        ``kill-after-ack:N``) SIGKILLs this process right after the N-th batch's files are renamed
        and before any of its acknowledgements (or 0.3 s after they were sent), to test exactly the
        crash windows the landing record closes. Not for production use."""
        f = self.fault
        if f and f[0] == point and self.stats["batches"] == f[1]:
            if point == "ack":
                time.sleep(0.3)  # the acknowledgements reach the broker; its PUBRELs stay unread
            os.kill(os.getpid(), signal.SIGKILL)

    def _wait(self, seconds: float) -> None:
        sock = self.client.sock
        if sock is None:
            time.sleep(min(seconds, 0.05))
            return
        pending = getattr(sock, "pending", None)
        if pending and pending():
            return
        try:
            select.select([sock], [], [], seconds)
        except (OSError, ValueError):
            pass  # closed under us: the next loop() notices

    def _disconnect(self, timeout: float = 2.0, props: dict | None = None) -> None:
        """DISCONNECT (the session stays), then close only once the broker has closed its side (the
        client half-closes and reads until the broker's end of stream: closing with unread data in
        the socket would reset the connection, and a reset can discard our last acknowledgements)."""
        self.client.disconnect(0, props, linger_ms=int(timeout * 1000))

    def run(self) -> int:
        a = self.args
        try:
            self.writer.check()
            stale = self.writer.remove_stale_temps()
        except LandingError as e:
            self.say(f"error: {e}")
            return EXIT_FAIL
        if stale:
            self.say(f"removed {stale} temporary file(s) left by an earlier run")
        try:
            self.landed_q2 = self.writer.last_record()
        except LandingError as e:
            self.say(f"error: {e}")
            return EXIT_FAIL
        try:
            for ident in self.writer.recent_qos2(a.qos2_window):
                self._seen(ident)
        except LandingError as e:
            self.say(f"error: {e}")
            return EXIT_FAIL
        if self.landed_q2:
            self.say(f"{len(self.landed_q2)} QoS 2 message(s) in the newest landing file may not be "
                     "released by the broker yet: a resend of one is acknowledged, not landed again")
        from tern.client import ConnectError

        try:
            present = self.client.connect()
            self.say(f"connected to {a.host}:{a.port} (session present: {int(bool(present))})")
            if a.retire:
                codes = self.client.unsubscribe(self.filter)
            else:
                codes = self.client.subscribe(self.filter, a.qos)
        except ConnectError as e:
            self.say(f"error: {a.host}:{a.port} refused the connection ({e})")
            return EXIT_FAIL
        except OSError as e:
            self.say(f"error: cannot connect to {a.host}:{a.port}: {e}")
            return EXIT_FAIL
        mqtt = "5" if a.version == 5 else "3.1.1" if a.version == 4 else "3.1"
        if a.retire:
            self.say(f"retiring: unsubscribed from {self.filter} (reason codes {codes or 'none'}, "
                     f"MQTT {mqtt}, session present: {int(bool(present))}); landing what the broker "
                     f"still holds for this id, until nothing comes for {a.drain_idle:g} s")
        elif not codes or codes[0] >= 0x80:
            self.say(f"error: the broker refused the subscription {self.filter!r} "
                     f"(reason 0x{(codes or [0x80])[0]:02X})")
            self._disconnect()
            return EXIT_FAIL
        else:
            self.say(f"subscribed to {self.filter} at QoS {codes[0]} on {a.host}:{a.port} "
                     f"(MQTT {mqtt}, session present: {int(bool(present))}), landing in "
                     f"{self.writer.root}")

        def on_signal(signum, frame):
            self.stop_reason = signal.Signals(signum).name

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        t0 = time.monotonic()
        status = EXIT_OK
        try:
            self._loop()
            self.flush()
        except LandingError as e:
            self.say(f"error: {e}; {self.unwritten} message(s) not written and not acknowledged "
                     "(the broker keeps them for this --id)")
            status = EXIT_FAIL
        except CollectError as e:
            self.say(f"error: {e}")
            status = EXIT_FAIL
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if self.retired:
                status = self._end_session()
            else:
                if a.retire and status == EXIT_OK:
                    self.say(f"retirement interrupted ({self.stop_reason}): the session, and what "
                             "it still holds, stay with the broker; run --retire again")
                self._disconnect()
        s = self.stats
        why = self.stop_reason or ("retired" if self.retired else "")
        self.say(f"{'stopped (' + why + ')' if why else 'stopped'}: "
                 f"landed={s['landed']} quarantined={s['quarantined']} acked={s['acked']} "
                 f"files={self.writer.files} bytes={self.writer.bytes} batches={s['batches']} "
                 f"redelivered={s['redelivered']} resent_matched={s['resent_matched']} "
                 f"written_unacked={s['written_unacked']} qos2_already_landed={s['qos2_already_landed']} "
                 f"seconds={time.monotonic() - t0:.1f}")
        return status

    def _loop(self) -> None:
        """Receive, write due batches, report progress: until a signal (or, retiring, drained)."""
        from tern.client import ConnectError

        a = self.args
        next_report = time.monotonic() + a.progress if a.progress else None
        last_landed = 0
        while self.stop_reason is None:
            try:
                self.client.loop(0)
            except ConnectError as e:
                raise CollectError(f"the broker refused the reconnection ({e})") from None
            if self.resubscribe and self.client.connected:
                self.resubscribe = False
                try:
                    if a.retire:
                        codes = self.client.unsubscribe(self.filter)
                        self.say(f"unsubscribed again from {self.filter} (reason codes {codes})")
                    else:
                        codes = self.client.subscribe(self.filter, a.qos)
                        self.say(f"subscribed again to {self.filter} (reason codes {codes})")
                except OSError as e:  # lost again: the next connect sets resubscribe
                    self.say(f"subscribing again failed: {e}")
            if self._due():
                self.flush()
                self.last_activity = time.monotonic()
                continue
            if a.retire and self._drained():
                self.retired = True
                return
            now = time.monotonic()
            if next_report is not None and now >= next_report:
                rate = (self.stats["landed"] - last_landed) / a.progress
                last_landed = self.stats["landed"]
                self.say(f"landed {self.stats['landed']} ({rate:.0f}/s), quarantined "
                         f"{self.stats['quarantined']}, files {self.writer.files}, "
                         f"waiting {self.unwritten}")
                next_report = now + a.progress
            b = self.batch
            wait = 0.2
            if b.count:
                wait = max(0.0, min(wait, b.first_at + a.batch_time - now))
            if a.retire:
                wait = max(0.0, min(wait, self.last_activity + a.drain_idle - now))
            if next_report is not None:
                wait = max(0.0, min(wait, next_report - now))
            self._wait(wait)

    # --- retiring -------------------------------------------------------------------------------

    def _drained(self) -> bool:
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

    def _end_session(self) -> int:
        """Retiring, drained: end the session at the broker so nothing more is kept for this id.
        MQTT 5: DISCONNECT with Session Expiry Interval 0. MQTT 3.x has no such property: a normal
        DISCONNECT, then a clean-session connect with the same id (which discards the old session)
        and its DISCONNECT (a clean session ends with its connection)."""
        a = self.args
        if not self.client.connected:  # lost at the last moment: the session stays, so may the rest
            self._disconnect()
            self.say("error: the connection was lost before the session could be ended; everything "
                     "received was landed; run --retire again")
            return EXIT_FAIL
        if a.version == 5:
            from tern import props as P

            self._disconnect(props={P.SESSION_EXPIRY_INTERVAL: 0})
            self.say("retired: the session ended at the broker (DISCONNECT, session expiry 0)")
            return EXIT_OK
        self._disconnect()
        from tern.client import Client

        c = Client(a.id, clean=True, reconnect=False, keepalive=a.keepalive, **self.conn)
        try:
            c.connect()
            c.disconnect()
        except OSError as e:
            self.say(f"error: everything was landed, but the final clean-session connect to end the "
                     f"session failed: {e}; run --retire again")
            return EXIT_FAIL
        self.say("retired: the session ended at the broker (clean-session connect and DISCONNECT)")
        return EXIT_OK
