"""Runnable examples. ``examples.workflows`` is importable from the repository root."""
