"""The `tern` pytest11 entry point: it loads ternlab.pytest_plugin under that module's own name.

Registered directly, the plugin module would carry two names (`tern` from the entry point,
`ternlab.pytest_plugin` from `-p ternlab.pytest_plugin`) and pytest stops with "Plugin already
registered under a different name". Through this module both ways name it alike; `-p no:tern` blocks
this module and with it the plugin.
"""

pytest_plugins = ["ternlab.pytest_plugin"]
