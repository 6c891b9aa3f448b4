"""The embedded store: one SQLite file in WAL mode, written by one storage thread with group commit.

:class:`~latticed.storage.engine.Engine` is the async entry point; the rest are its parts.
"""
