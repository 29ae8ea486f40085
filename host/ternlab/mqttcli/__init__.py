"""`tern pub` and `tern sub`, mosquitto_pub/mosquitto_sub on the Tern client: `commands` registers them
(its docstring lists what each other module here does). `flags` and `redact` also serve `tern collect`
and the `tern` command as a whole."""
