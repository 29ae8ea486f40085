# Freeze the Tern client and the telemetry app into a MicroPython firmware image, so their bytecode
# runs from flash instead of being loaded onto the heap. Build steps: docs/app.md, e.g.
#   make -C ports/esp32 BOARD=ESP32_GENERIC FROZEN_MANIFEST=/path/to/tern/firmware/app/manifest.py
# Paths below are relative to this file. The port's own manifest comes first so the image keeps
# what the board normally freezes. main.py and config.json stay on the board's filesystem.
# Tern's device set (never the host codec) comes from lib/tern/manifest.py.
include("$(PORT_DIR)/boards/manifest.py")
include("../../lib/tern")
module("hal.py")
module("tconfig.py")
module("telemetry.py")
