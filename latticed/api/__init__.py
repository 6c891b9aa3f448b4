"""The local API: msgpack requests over a Unix socket.

* :mod:`.messages`: the message format both sides speak (envelopes, errors, versions).
* :mod:`.client`: the blocking client (no trio), for the CLI, Spark and applications.
* :mod:`.server`: the trio server inside the daemon.

The client never imports the server (an import-linter contract).
"""
