"""Tern: an MQTT client that does not lose messages."""
