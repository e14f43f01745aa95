"""Plumbing shared by every layer: atomic writes, bounded readers, locks, console, signals."""
