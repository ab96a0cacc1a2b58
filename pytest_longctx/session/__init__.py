"""The pytest layer: everything that knows about pytest, besides plugin.py."""
