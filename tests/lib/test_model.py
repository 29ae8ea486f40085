"""The model-based test (tests/lib/model.py) in CI: seeded examples of up to
200 steps over the real Session with each store at small capacities
(max_pending 4-8, a 4 KiB flash partition, a FileStore of 4,000 bytes), the
same examples on CPython and on the MicroPython unix port (fewer there).
tools/model_sweep.py runs a long budget. A failure names its seed and its
shrunk step list; `python tools/model_sweep.py --seed N --rig R` replays it."""

from check import MICROPYTHON
import model

MP_HEAPSIZE = "2m"
MP_TIMEOUT = 280
STEPS = 200


def _budget(rig, n_cpython, n_micropython, first=1):
    n = n_micropython if MICROPYTHON else n_cpython
    count, found = model.budget([rig], range(first, first + n), STEPS)
    assert count == n
    assert not found, "\n".join(found)


def test_model_memory_store():
    _budget("memory", 2000, 300)


def test_model_flash_store():
    _budget("flash", 1500, 200, 5000)


def test_model_file_store():
    _budget("file", 800, 150, 9000)


def test_model_across_the_counter_wraps():
    """Every store started with its counters just before their wraps (packet
    id 65500 with ids pending across 65535 -> 1; record sequence 2^32 - 41;
    FlashStore's sector sequence 2^32 - 3; FileStore's segment 99999997):
    each wraps within an example's first hundred or so store writes (all of
    them in 28, 29 and 36 of seeds 21000-21039 on flash-wrap, file-wrap, memory-wrap)."""
    for rig, seed in (("memory-wrap", 20000), ("flash-wrap", 21000), ("file-wrap", 22000)):
        _budget(rig, 40, 8, seed)


class LossyStore(model.MemoryStore):
    """A store with a planted bug: a release also drops the oldest other record."""

    def release(self, pid):
        model.MemoryStore.release(self, pid)
        if len(self._pids) > 2:
            model.MemoryStore.release(self, self._pids[0])


def test_model_finds_a_planted_loss_and_shrinks_it():
    class LossyRig(model.MemRig):
        def boot(self):
            self.st = LossyStore()
            return self.st

    model.RIGS["lossy"] = LossyRig
    try:
        count, found = model.budget(["lossy"], range(1, 9), STEPS)
    finally:
        del model.RIGS["lossy"]
    assert found, "the model let a store that loses records pass"
    f = found[0]
    assert f.startswith("lossy seed ") and "minimal steps" in f, f
    small = eval(f.rpartition(": ")[2])
    assert 2 <= len(small) < 20, f  # shrunk: a fill and an ack or so
