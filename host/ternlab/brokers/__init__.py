"""What the harness puts on the other end of a client's connection:

- ``mosquitto`` -- the reference broker (Eclipse Mosquitto from a generated config, 127.0.0.1 only);
- ``certs``     -- throw-away CA and certificates for its TLS listener;
- ``chaos``     -- an MQTT-aware TCP proxy that cuts, stalls and slows a connection on cue;
- ``scripted``  -- a fake broker playing byte-exact scripts, for cases no real broker produces;
- ``recorder``  -- a one-connection broker recording how a client's packets leave.
"""
