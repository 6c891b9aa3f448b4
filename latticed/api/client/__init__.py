"""The blocking client of the local API (no trio): used by the CLI, the Spark source and applications.

Reaches the daemon only through its socket: it imports the shared messages (:mod:`latticed.api.messages`),
the public errors, ``host`` (the socket's path, retention policy values) and the pure packages; never
:mod:`latticed.api.server`, storage, the network or trio.
"""
