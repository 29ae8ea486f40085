"""Tern host side: harness, broker control, pipeline and the `tern` command."""
