# Tern's device set, in micropython-lib style: what goes on a board. Frozen into an image with
# include("path/to/lib/tern") from a FROZEN_MANIFEST (firmware/app/manifest.py does), copied by
# `tern deploy`, installed by `mpremote mip install` (package.json at the repository's top, checked
# against this list by tests/host/test_device_set.py). The full codec (codec.py) is for hosts and
# tests only and never goes on a board; this file itself is not a module.
#
# Options, e.g. include("../lib/tern", aio=False): aio (the asyncio driver, tern.aio), flashstore
# (the outbox on a raw flash partition), filestore (the outbox on a filesystem). All on by default.
options.defaults(aio=True, flashstore=True, filestore=True)

files = ["__init__.py", "wire.py", "propids.py", "props.py", "pkt.py", "topic.py", "message.py",
         "store.py", "session.py", "events.py", "handshake.py", "replay.py", "v5.py", "fault.py", "manual.py", "client.py", "refused.py",
         "tls.py"]
if options.aio:
    files.append("aio.py")
if options.flashstore or options.filestore:
    files.append("logrec.py")
if options.flashstore:
    files.append("flashstore.py")
if options.filestore:
    files.append("filestore.py")
package("tern", files, base_path="..")
