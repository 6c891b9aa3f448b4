"""The embedded store: one SQLite file in WAL mode, written by one storage thread with group commit.

:class:`~latticed.storage.engine.Engine` is the async entry point, built from the storage-thread bridge
(:mod:`.bridge`), the live-push cache (:mod:`.live`) and the replica view (:mod:`.replica`); :mod:`.wiring`
holds the change fan-out and the owner fence the daemon gives the engine and the services. The rest are the
storage thread's parts.
"""
