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
- Payloads :func:`.schema.parse_payload` rejects (by the rules of the columns they would land in) go
  to the quarantine partition with their raw bytes and the reason, and are acknowledged like the rest.
  Nothing that arrives can stop the collector: an exception nothing foresaw while one message is taken,
  or a row the Parquet writer still refuses, quarantines that message (``errors``, one log line).
- A lost connection: messages of the old connection that are not yet written can no longer be
  acknowledged. They are kept; when the broker sends one again (it should: the session is persistent)
  the new copy replaces it and is acknowledged once written; the ones it does not send again within
  ``--batch-time`` (a broker that crashed before saving them) are written unacknowledged. Their wait
  counts from their first arrival and first orphaning, kept through later reconnects, so a link that
  drops faster than ``--batch-time`` still gets them written. A broker crash costs no message and,
  when the broker did keep them, no duplicate.
- SIGTERM / SIGINT: the current batch is written and acknowledged, then the collector disconnects
  cleanly (the session stays) and exits 0.
- QoS 2 exactly once, by one identity rule (:mod:`.qos2`: a well-formed message is the audit's key,
  device, boot, payload ``q`` and seq; a malformed one its topic and bytes), across a kill too: every
  landing file carries the record of the QoS 2 deliveries landed and not yet released by the broker
  (packet id + identity), committed by the same rename as the rows. At start the collector reads it
  back from its newest commit; a resend (DUP set) with a recorded packet id and the same identity is
  acknowledged (PUBREC, then PUBCOMP on the PUBREL) and not landed again (``qos2_already_landed``). A
  PUBREL tells it the broker has the PUBREC (the entry is dropped), as does another message under that
  packet id. QoS 1 has no such release: a kill between a file's rename and its PUBACKs still gives
  duplicates.
- QoS 2 exactly once, whatever the broker sends: a message whose payload says ``q: 2`` is also
  recognised by its identity against a window of the newest ``--qos2-window`` such messages landed or
  held (kept in the collector's window log, :class:`.landing.WindowLog`, and rebuilt from it at start
  in bounded time). A copy in the window is acknowledged and not landed (``qos2_already_landed``),
  with or without DUP, under any packet id: a broker restarted (hard or soft) may send a message again
  after our PUBREC or even after the PUBCOMP (it saved its state before them), and a broker that lost
  its state gets the device's own resend of a message it had already delivered. A malformed payload is
  not in the window: the same bytes sent again on purpose are kept each time. A resend that reaches
  *another* collector of the group is not seen here (each collector knows its own window); the audit
  counts it.
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

from collections import OrderedDict

from ..mqttcli.redact import redact
from . import qos2, retire, schema
from .batch import Batch, clean as _clean
from .landing import LANDING_ARROW, QUARANTINE_ARROW, LandingError, LandingWriter, unwritable_rows

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class CollectError(Exception):
    """The collector cannot go on; the message is one line."""


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
        self.writer = LandingWriter(args.landing, args.id, args.qos2_window)
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
                      "written_unacked": 0, "qos2_already_landed": 0, "batches": 0, "errors": 0,
                      "dropped": 0}
        # Messages delivered at QoS 2 and landed that the broker may still send again: {packet id:
        # identity} (the record, see .qos2). Read back from the newest commit at start, carried in
        # every file written, and emptied as the broker releases them (PUBREL), reuses their packet
        # id, or forgets the session.
        self.landed_q2: dict = {}
        # The identities of the newest QoS 2 messages landed or held (.qos2.in_window), oldest
        # first, at most --qos2-window of them: a copy found here is not landed again.
        self.q2_seen: OrderedDict = OrderedDict()
        opts = {"manual_ack": True, "store": _release_store(self), "rx_size": args.max_packet}
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
        print(redact(f"tern collect [{self.args.id}]: {text}"), file=self.out, flush=True)

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
            # How long they wait counts from their first arrival and their first orphaning, both
            # kept through later reconnects and through a resend that replaces one (see _take): a
            # link that drops more often than --batch-time must not hold them for ever.
            now = time.monotonic()
            o.first_at = min(o.first_at, b.first_at) if o.count else b.first_at
            o.orphaned_at = min(o.orphaned_at, b.orphaned_at or now) if o.count else (b.orphaned_at or now)
            o.count += b.count
            o.nbytes += b.nbytes
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
        self.arrivals += 1
        self.last_activity = time.monotonic()
        if m.dup:
            self.stats["redelivered"] += 1
        try:
            self._take(m, raw)
        except Exception as e:  # a bug or a value nothing foresaw: this message only, never a crash
            self._unforeseen(m, raw, e)

    def _take(self, m, raw: bytes) -> None:
        """Land, quarantine or answer one message. Everything that can fail happens before the
        message joins the batch, so a failure leaves nothing half done (see _unforeseen)."""
        self._fault("message", raw)
        p = bad = None
        try:
            p = schema.parse_payload(raw)
        except ValueError as e:
            bad = e
        ident = qos2.identity(m.topic, raw, p)
        pid = m.pid if m.qos else None
        if m.qos == 2:
            known = self.landed_q2.get(pid)
            if known is not None:
                if m.dup and known in (ident, qos2.payload_key(m.topic, raw)):
                    # A resend of a QoS 2 message already in a landing file (the PUBREC was lost
                    # with a killed collector or a broken connection): answer it, do not land it.
                    # The PUBREC leaves in arrival order; the PUBREL that follows is completed.
                    self._already_landed(m)
                    return
                # another message under that packet id: the broker had released the landed one
                del self.landed_q2[pid]
        orphan = bool(self.orphan_keys) and (m.topic, raw) in self.orphan_keys
        win = ident if qos2.in_window(p) else None
        if win is not None and not orphan and win in self.q2_seen:
            # the same QoS 2 reading, landed (or held in this batch) already: a resend after a broker
            # restart, or the device's own after the broker lost it. Answered, not landed.
            self._already_landed(m)
            return
        idx = self.idx + 1
        now = time.time()
        q2 = (pid, ident) if m.qos == 2 else None
        if p is None:
            row = {"payload_raw": raw, "reason": _clean(str(bad)), "recv_ts": now, "topic": m.topic,
                   "collector": self.args.id, "_idx": idx, "_q2": q2}
        else:
            row = {"device": p["device"], "boot": p["boot"], "seq": p["seq"], "qos": p["qos"],
                   "topic": m.topic, "sent_ts": p["sent_ts"], "recv_ts": now, "recv_idx": idx,
                   "collector": self.args.id, "readings": list(p["readings"].items()),
                   "payload_raw": raw if self.args.keep_raw else None, "_raw": raw, "_q2": q2,
                   "_win": win}
            if self.fault and self.fault[0] == "unwritable" and self.fault[1] in raw:
                row["readings"] = [("fault", "not a number")]  # test-only: a row Parquet refuses
        # nothing below raises
        self.idx = idx
        if orphan:  # the resend of a message we held from the old connection: keep this copy only
            key = (m.topic, raw)
            self.orphans.remove(*key)
            self.stats["resent_matched"] += 1
            n = self.orphan_keys[key]
            if n == 1:
                del self.orphan_keys[key]
            else:
                self.orphan_keys[key] = n - 1
        elif win is not None:
            self._seen(win)
        b = self.batch
        b.add(row, p is None, m.ack_id if m.qos else None)
        if orphan:  # the resend keeps the age of the copy it replaces
            o = self.orphans
            b.first_at = min(b.first_at, o.first_at)
            b.orphaned_at = o.orphaned_at if b.orphaned_at is None else min(b.orphaned_at, o.orphaned_at)

    def _dropped(self) -> None:
        """Report what the client discarded as larger than --max-packet (MQTT 3.x has no way to tell
        the broker the limit; under MQTT 5 the broker drops such messages for this collector and
        only its own log says so)."""
        n = self.client.session.stats_dropped
        if n > self.stats["dropped"]:
            self.say(f"error: {n - self.stats['dropped']} message(s) larger than --max-packet "
                     f"({self.args.max_packet} bytes) dropped: raise --max-packet above the broker's "
                     "message_size_limit")
            self.stats["dropped"] = n

    def _already_landed(self, m) -> None:
        self.stats["qos2_already_landed"] += 1
        if m.qos:
            try:
                self.client.ack(m.ack_id)
            except OSError:  # the connection broke: the broker sends it again, answered again
                pass

    def _unforeseen(self, m, raw: bytes, e: Exception) -> None:
        """An exception nothing foresaw while taking one message: that message is quarantined with
        the exception as its reason (and acknowledged once written, like any), counted in ``errors``
        and reported; the collector goes on."""
        self.stats["errors"] += 1
        why = _clean(f"collector error: {type(e).__name__}: {e}")
        self.say(f"error: a message on {m.topic!r} ({len(raw)} bytes) could not be handled "
                 f"({why}); it goes to quarantine")
        self.idx += 1
        q2 = (m.pid, qos2.payload_key(m.topic, raw)) if m.qos == 2 else None
        self.batch.add({"payload_raw": raw, "reason": why, "recv_ts": time.time(), "topic": m.topic,
                        "collector": self.args.id, "_idx": self.idx, "_q2": q2}, True,
                       m.ack_id if m.qos else None)

    def _seen(self, ident: bytes) -> None:
        """Remember a QoS 2 message's identity; the oldest leaves once the window is full."""
        seen = self.q2_seen
        seen[ident] = None
        if len(seen) > self.args.qos2_window:
            seen.popitem(last=False)

    # --- the loop -------------------------------------------------------------------------------

    def _orphans_due(self, now: float) -> bool:
        """Orphans are written (unacknowledged) once the broker had --batch-time to send them again
        since they were orphaned, and they are --batch-time old."""
        o = self.orphans
        return bool(o.count) and now >= max(o.first_at, o.orphaned_at) + self.args.batch_time

    def _due(self) -> bool:
        a = self.args
        now = time.monotonic()
        if self._orphans_due(now):
            return True
        b = self.batch
        if not b.count or not self.client.connected:
            return False  # while offline the batch waits: at reconnection it becomes orphans
        return (b.count >= a.batch_size or b.nbytes >= a.batch_bytes
                or now - b.first_at >= a.batch_time)

    @property
    def unwritten(self) -> int:
        return self.batch.count + self.orphans.count

    def flush(self, everything: bool = True) -> None:
        """Write the batch (and the orphans, unless ``everything`` is false and they are not due yet)
        durably, then acknowledge the batch's messages in arrival order; orphans (from an earlier
        connection) cannot be acknowledged."""
        b, o = self.batch, self.orphans
        keep = None
        if not everything and o.count and not self._orphans_due(time.monotonic()):
            keep, o = (o, self.orphan_keys), Batch()  # the broker may still send them again
        if not b.count and not o.count:
            return
        try:
            self._commit(b, o)  # raises LandingError: nothing acknowledged
        except LandingError:
            raise
        except Exception as e:  # a row the Parquet writer refuses, which parse_payload let through
            self._salvage(e, (o, b))
            self._commit(b, o)
        self.batch, self.orphans, self.orphan_keys = Batch(), Batch(), {}
        if keep:
            self.orphans, self.orphan_keys = keep
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

    def _commit(self, b: Batch, o: Batch) -> None:
        rows, quarantine = o.merged(b) if o.count else (b.rows, b.quarantine)
        try:
            self.landed_q2 = self.writer.commit(rows, quarantine, self.landed_q2)
        except LandingError as e:  # some files may be on disk: counted as written (not acknowledged)
            self.stats["landed"] += e.landed
            self.stats["quarantined"] += e.written - e.landed
            self.stats["written_unacked"] += e.written
            raise
        self.stats["landed"] += len(rows["recv_ts"])
        self.stats["quarantined"] += len(quarantine["recv_ts"])

    def _salvage(self, e: Exception, batches) -> None:
        """The batch could not become Parquet: each landing row the writer refuses on its own goes to
        quarantine with the writer's reason (counted in ``errors``, reported); nothing is on disk yet
        (the writer builds every table before it writes)."""
        why = _clean(f"{type(e).__name__}: {e}")
        moved = 0
        for batch in batches:
            for i, reason in sorted(unwritable_rows(batch.rows, LANDING_ARROW).items(), reverse=True):
                row = batch.to_quarantine(i, _clean(f"cannot be written as Parquet: {reason}"))
                if row["_win"] is not None:
                    self.q2_seen.pop(row["_win"], None)  # not landed: a copy may land
                moved += 1
            for i in unwritable_rows(batch.quarantine, QUARANTINE_ARROW):
                batch.quarantine["topic"][i] = _clean(repr(batch.quarantine["topic"][i]))
                batch.quarantine["reason"][i] = _clean(repr(batch.quarantine["reason"][i]))
        self.stats["errors"] += moved
        self.say(f"error: the batch could not be written as Parquet ({why}); {moved} message(s) "
                 "the writer refuses go to quarantine")

    def _fault(self, point: str, payload: bytes = b"") -> None:
        """Test-only fault injection: ``TERN_COLLECT_FAULT=kill-after-commit:N`` (or
        ``kill-after-ack:N``) SIGKILLs this process right after the N-th batch's files are renamed
        and before any of its acknowledgements (or 0.3 s after they were sent), to test exactly the
        crash windows the landing record closes; ``fail-on-payload:TEXT`` raises an exception
        nothing foresees while taking a message whose payload holds TEXT, and ``unwritable:TEXT``
        gives such a message a row the Parquet writer refuses. Not for production use."""
        f = self.fault
        if f and f[0] == point == "message" and f[1] in payload:
            raise RuntimeError("injected by TERN_COLLECT_FAULT")
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
            for ident in self.writer.window_keys():
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
            done = (f"; {e.written} message(s) of it were written before (not acknowledged: the broker "
                    "sends them again)") if e.written else ""
            self.say(f"error: {e}{done}; {self.unwritten - e.written} message(s) not written and not "
                     "acknowledged (the broker keeps them for this --id)")
            status = EXIT_FAIL
        except CollectError as e:
            self.say(f"error: {e}")
            status = EXIT_FAIL
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if self.retired:
                status = EXIT_OK if retire.end_session(self) else EXIT_FAIL
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
                 f"errors={s['errors']} dropped={s['dropped']} seconds={time.monotonic() - t0:.1f}")
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
            self._dropped()
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
                self.flush(everything=False)
                self.last_activity = time.monotonic()
                continue
            if a.retire and retire.drained(self):
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
