"""Board entry point: run the telemetry app (firmware/app/telemetry.py).

An unexpected error (even one while importing the app) is printed, then the board waits 30 s before
it resets: a fault that survives a reset costs a slow retry rather than a tight boot loop. The wait
feeds the watchdog the app started (hal.dog; 8 s at most on the Pico W), so the 30 s hold. Config
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
    d = getattr(sys.modules.get("hal"), "dog", None)  # None: hal failed to load, so no dog was started
    for _ in range(60):
        if d:
            d.feed()
        sleep_ms(500)
    import hal

    hal.reset()
