"""Runs one library test function under the MicroPython unix port.

Invoked by tests/lib/conftest.py as
    micropython mp_run.py MODULE FUNCTION JSON_KWARGS
with MICROPYPATH pointing at lib/ and tests/lib/. Prints the MicroPython
traceback and exits 1 when the test fails.
"""

import sys
import json


def main():
    mod_name, fn_name, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    mod = __import__(mod_name)
    fn = getattr(mod, fn_name)
    try:
        fn(**kwargs)
    except BaseException as e:  # noqa: B036 - report everything, including MemoryError
        sys.print_exception(e)
        sys.exit(1)
    print("TERN-MP-PASS")


main()
