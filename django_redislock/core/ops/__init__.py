"""Operators' tools over Redis: list and inspect held locks, force them free."""
