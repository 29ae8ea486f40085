"""A device process that publishes offline and is then killed with SIGKILL (run by test_filestore).

    python|micropython killed_publisher.py MEDIUM PATH N

MEDIUM posix (FileStore in the directory PATH), lfs (FileStore on LittleFS over the emulated NOR
flash image PATH, formatted by the caller) or flash (FlashStore on the NOR flash image PATH, 8 x 4 KiB
blocks). A real Client with the store in group commit mode and no broker publishes N QoS 1 messages, printing `ACC pid` after each publish() returned, then has the
shell SIGKILL this process: no line of Python runs after the last publish() (no close, no flush).
"""

import os
import sys

# tern and norflash come from the caller's path (MICROPYPATH, PYTHONPATH: test_filestore), storekit
# from this folder (the script's own, first on the path)
from tern.client import Client
from tern.filestore import FileStore


def main():
    medium, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    fs = None
    if medium == "flash":
        from norflash import NorFlash
        from tern.flashstore import FlashStore

        st = FlashStore(NorFlash(path, blocks=8), group_commit=True, verbose=False)
    else:
        if medium == "lfs":
            from storekit import LfsVolume

            path, fs = LfsVolume(path, format=False).mount()
        st = FileStore(path, fs=fs, group_commit=True, verbose=False)
    c = Client("killed", server="127.0.0.1", port=9, store=st, reconnect=False)  # offline: never connects
    for i in range(n):
        print("ACC %d" % c.publish("tern/killed", b"reading %d" % i, qos=1))
    os.system("kill -9 $PPID")  # the shell's parent is this process
    print("NOT KILLED")


main()
