"""Helpers the store tests share (FlashStore, FileStore, the contract, the
power-cut sweeps): temporary paths, and LittleFS volumes on the emulated NOR
flash on both runtimes. Not a test module: pytest collects nothing here, and
MicroPython imports it from tests/lib like the tests themselves (and the qemu
boards from their ROMFS): it imports nothing of tests/lib, so the test kit
imports it as tests.lib.storekit too."""

import os
import sys

from norflash import NorFlash, PowerCut

MICROPYTHON = sys.implementation.name == "micropython"  # (as check's: a module of no imports of tests/lib)


# -- temporary files ---------------------------------------------------------------
def tmppath(tag):
    """A fresh path under /tmp that works on both runtimes."""
    r = os.urandom(6)
    return "/tmp/tern-%s-%s" % (tag, "".join("%02x" % b for b in r))


def rm(*paths):
    for p in paths:
        for q in (p, p + ".wear"):
            try:
                os.remove(q)
            except OSError:
                pass


def rmtree(path):
    try:
        names = os.listdir(path)
    except OSError:
        return
    for n in names:
        p = path + "/" + n
        try:
            os.remove(p)
        except OSError:
            rmtree(p)
    try:
        os.rmdir(path)
    except OSError:
        pass


# -- LittleFS over the emulated flash, on both runtimes --------------------------
class NorContext:
    """littlefs-python's block-device callbacks, onto a NorFlash (CPython only).

    littlefs-python ignores exceptions raised in callbacks, so a power cut is
    handed to littlefs as an I/O error (it then fails the call in progress)."""

    LFS_ERR_IO = -5

    def __init__(self, dev):
        self.dev = dev

    def read(self, cfg, block, off, size):
        b = bytearray(size)
        if not self.dev.dead:
            self.dev.readblocks(block, b, off)
        return b

    def prog(self, cfg, block, off, data):
        try:
            self.dev.writeblocks(block, data, off)
        except PowerCut:
            return self.LFS_ERR_IO
        return 0

    def erase(self, cfg, block):
        try:
            self.dev.ioctl(6, block)
        except PowerCut:
            return self.LFS_ERR_IO
        return 0

    def sync(self, cfg):
        return 0


_GRAVEYARD = []
LFS_OPTS = {"readsize": 32, "progsize": 32, "lookahead": 32}


def lfs_mount(dev, fresh=False):
    """CPython: a littlefs-python filesystem on `dev` (formatted if fresh)."""
    from littlefs import LittleFS

    fs = LittleFS(
        context=NorContext(dev),
        block_size=dev.block_size,
        block_count=dev.blocks,
        read_size=32,
        prog_size=32,
        lookahead_size=32,
        mount=False,
    )
    if fresh:
        fs.format()
    fs.mount()
    return fs


class LfsVolume:
    """A LittleFS volume on an emulated NOR flash image, mountable again after a cut."""

    def __init__(self, path, blocks=32, format=True):
        self.path = path
        self.blocks = blocks
        self.mp = "/" + path.rpartition("/")[2]
        self.dev = None
        self.fs = None
        if not format:
            return
        self.dev = NorFlash(path, blocks=blocks, fresh=True)
        if MICROPYTHON:
            import vfs

            vfs.VfsLfs2.mkfs(self.dev, **LFS_OPTS)
        else:
            lfs_mount(self.dev, fresh=True).unmount()
        self.dev.close()
        self.dev = None
        self.fs = None

    def mount(self, cut_at=0, seed=1):
        """Power on: a new device object on the image; returns (store dir, fs or None)."""
        self.dev = NorFlash(self.path, blocks=self.blocks, cut_at=cut_at, seed=seed)
        if MICROPYTHON:
            import vfs

            vfs.mount(vfs.VfsLfs2(self.dev, **LFS_OPTS), self.mp)
            return self.mp + "/outbox", None
        self.fs = lfs_mount(self.dev)
        return "/outbox", self.fs

    def unmount(self):
        """Power off (after a cut too): forget the mount and the device object."""
        if MICROPYTHON:
            import vfs

            try:
                vfs.umount(self.mp)
            except Exception:
                pass
        if self.fs is not None:
            # littlefs-python frees the filesystem with the object, and a file
            # a dead store left open would then write into freed memory
            _GRAVEYARD.append(self.fs)
            self.fs = None
        if self.dev is not None:
            self.dev.close()
            self.dev = None

    def cleanup(self):
        self.unmount()
        rm(self.path)
