"""Board entry point: run the telemetry app (firmware/telemetry.py).

An unexpected error (even one while importing the app) is printed, then the board waits 30 s before
it resets: a fault that survives a reset costs a slow retry rather than a tight boot loop. Config
errors never get here: tconfig reports them and uses defaults."""

try:
    import telemetry

    telemetry.main()
except Exception as e:  # not KeyboardInterrupt: Ctrl-C still reaches the REPL
    import sys
    import json
    from time import sleep_ms

    print("TERN " + json.dumps({"ev": "crash", "err": repr(e)}))  # hal.PREFIX: hal may be what failed
    sys.print_exception(e)
    sleep_ms(30000)
    import hal

    hal.reset()
