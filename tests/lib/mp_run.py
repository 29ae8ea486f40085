"""Runs one library test function under the MicroPython unix port.

Invoked by tests/lib/conftest.py as
    micropython mp_run.py MODULE FUNCTION
with MICROPYPATH pointing at lib/, tests/lib/ and the checkout's root (for tests.lib.kit) and the keyword arguments as
JSON in TERN_MP_KWARGS (not on the command line: the unix port stops with
"FATAL: uncaught NLR" on an argument of 256 bytes or more). Prints the MicroPython
traceback and exits 1 when the test fails.
"""

import os
import sys
import json


def main():
    mod_name, fn_name, kwargs = sys.argv[1], sys.argv[2], json.loads(os.getenv("TERN_MP_KWARGS"))
    mod = __import__(mod_name)
    fn = getattr(mod, fn_name)
    try:
        fn(**kwargs)
    except BaseException as e:  # noqa: B036 - report everything, including MemoryError
        sys.print_exception(e)
        sys.exit(1)
    print("TERN-MP-PASS")


main()
