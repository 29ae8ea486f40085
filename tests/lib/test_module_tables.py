"""tern.session's module globals leave room in their table (issue 39).

MicroPython keeps a module's globals in an open-addressing table that grows only when an insertion
finds it full (py/map.c: 1, 2, 4, 6, 8, 10, 12, 17, 23, 29, 37 ... slots), so a module with exactly
as many names as slots has none empty: every lookup its functions make that misses (each builtin,
`len`, `isinstance`) probes every slot before the builtins. tern.session had 23 names in 23 slots,
a few per cent of the instructions of every publish (docs/benchmarks.md, cpu_bench). Counted on both
runtimes: CPython's module dict also holds what MicroPython folds away (`_NAME = const(int)`) and its
own dunders, which are left out.
"""

import tern.session

_SIZES = (1, 2, 4, 6, 8, 10, 12, 17, 23, 29, 37, 47, 59, 73, 97)
_KEPT_DUNDERS = ("__name__", "__file__", "__getattr__")


def micropython_globals(mod):
    out = []
    for k, v in mod.__dict__.items():
        if k.startswith("__") and k not in _KEPT_DUNDERS:
            continue  # CPython's own (__doc__, __spec__ ...)
        if k.startswith("_") and not k.startswith("__") and isinstance(v, int) and not isinstance(v, bool):
            continue  # a private const(): folded into the bytecode on MicroPython
        out.append(k)
    return out


def slots(n):
    for s in _SIZES:
        if s >= n:
            return s
    raise AssertionError("more globals than this test knows table sizes for: %d" % n)


def test_the_count_matches_micropythons_table():
    # the rule above on a known case: 23 names fill 23 slots, 24 take 29
    assert slots(23) == 23 and slots(24) == 29 and slots(13) == 17


def test_session_globals_leave_a_fifth_of_their_table_empty():
    names = micropython_globals(tern.session)
    n = len(names)
    assert n * 5 <= slots(n) * 4, "tern.session: %d globals in %d slots: %s" % (n, slots(n), sorted(names))
