"""`--outbox DIR` of `tern pub` / `tern sub`: the session kept in a FileStore
in DIR, locked so one process at a time writes it, and owned by one client id
and MQTT version while it holds messages."""

import os
import re

from .errors import EXIT_FAIL, EXIT_OK, CLIError, os_reason, say_err

_OWNER = "tern-cli"  # meta key of the outbox: "<MQTT version> <client id>" of its session


def hold_outbox(args, kw):
    """--outbox DIR: put a FileStore holding the session into kw, with an
    exclusive lock on DIR so two processes never write one outbox at once.
    release_outbox(args) lets go of both."""
    if args.outbox is None:
        return
    import fcntl
    from tern.filestore import FileStore

    path = args.outbox
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise CLIError("--outbox %s: %s" % (path, os_reason(e)))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise CLIError("--outbox %s is in use by another tern process" % path)
    args.held = [fd]
    # the store's warnings come to store_notice (stdout is for messages)
    kw["store"] = FileStore(path, verbose=lambda msg: store_notice(args, msg))
    args.held.append(kw["store"])


_SEGMENT = re.compile(r"^(?:tern\.filestore: )?segment (\d+)(?:: | )")


def store_notice(args, msg):
    """A warning of the outbox's FileStore, said on stderr as one of the command's errors, with the
    file it is about, and remembered: the run then exits 1 (outbox_status). A torn tail is not one:
    it is the write a kill interrupted, of a message never accepted."""
    if "torn tail" in msg:
        return
    m = _SEGMENT.match(msg)
    where = "%s: " % os.path.join(args.outbox, "%08d.seg" % int(m.group(1))) if m else ""
    what = msg[m.end():] if m else msg.split(": ", 1)[-1]
    args.damaged = getattr(args, "damaged", 0) + 1
    say_err(args)("--outbox %s: %s%s; what it held (a message accepted on an earlier run, or the state of "
                  "one) is lost" % (args.outbox, where, what))


def outbox_status(args, code):
    """The exit status once the outbox reported damage: 1 (EXIT_FAIL) where it would have been 0."""
    return EXIT_FAIL if code == EXIT_OK and getattr(args, "damaged", 0) else code


def release_outbox(args):
    for h in reversed(getattr(args, "held", ())):
        try:
            os.close(h) if isinstance(h, int) else h.close()
        except OSError:
            pass
    args.held = []


def claim_outbox(args, session):
    """The outbox holds one client's session: refuse another client id or
    MQTT version while it has messages pending (they were encoded for it)."""
    store = session.store
    me = ("%d %s" % (args.version, args.client_id)).encode()
    owner = store.meta(_OWNER)
    if owner is not None and bytes(owner) != me:
        n = store.count()
        if n:
            v, _, cid = bytes(owner).decode("utf-8", "replace").partition(" ")
            raise CLIError("--outbox %s holds %d message(s) of client id %r (MQTT %s): run with -i %s -V %s "
                           "to send them, or use another directory" % (
                               args.outbox, n, cid, {"3": "3.1", "4": "3.1.1"}.get(v, v), cid,
                               {"3": "31", "4": "311"}.get(v, v)))
        store.in_clear()  # inbound QoS 2 ids of another session
    store.set_meta(_OWNER, me)


def kept(args, client):
    """'; N message(s) stay in DIR for the next run', when an outbox holds them."""
    n = len(client.session.pending()) if args.outbox is not None else 0
    return "; %d message(s) stay in %s for the next run" % (n, args.outbox) if n else ""
