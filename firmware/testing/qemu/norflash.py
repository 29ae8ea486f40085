"""On the qemu boards, for the library's store tests: `norflash.NorFlash` backed by the board's
own NOR flash model (module qboard: native memory, written through to the host's image), so the
tests of tests/lib that take a NorFlash(path, ...) run unchanged against the board's flash.

Each path is a run of blocks of the board's raw outbox partition (allocated on first use, reused
when the same path is opened again: a "reboot" sees what was written). A power cut on this board
ends QEMU (the host sees it): `cut_at` is not supported here, tests that cut use the board's own
arm_cut from the host."""

import emuboard
import qboard


class NorViolation(Exception):
    pass


class PowerCut(Exception):
    pass


_where = {}
_next = [0]


class NorFlash:
    def __init__(self, path=None, blocks=64, block_size=4096, cut_at=0, seed=1, fresh=False):
        if cut_at:
            raise ValueError("qemu board: cut with emuboard.arm_cut (the power cut ends QEMU)")
        part = emuboard.partition("outbox")
        total = part.ioctl(4, 0)
        start = _where.get(path)
        if start is None:
            if _next[0] + blocks > total:
                _next[0] = 0
            start = _next[0]
            _next[0] += blocks
            _where[path] = start
            fresh = True
        if block_size != part.ioctl(5, 0) or start + blocks > total:
            raise ValueError("qemu board: %d blocks of %d bytes do not fit the outbox partition" % (blocks, block_size))
        self.path = path
        self.blocks = blocks
        self.block_size = block_size
        self.dead = False
        self._dev = qboard.Flash(part_start() + start, blocks)
        self.readblocks = self._dev.readblocks
        self.writeblocks = self._dev.writeblocks
        self.ioctl = self._dev.ioctl
        if fresh:
            for b in range(blocks):
                self._dev.ioctl(6, b)

    def erase(self, block):
        return self._dev.ioctl(6, block)

    def close(self):
        pass


def part_start():
    return emuboard.PROFILE["flash"]["fs_blocks"]


def read_wear(path):
    raise OSError("qemu board: the wear counters are the host's (QemuBoard.flash_counters())")
