"""Backends, one module each, behind the small interface in base.py."""
