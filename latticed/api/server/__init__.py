"""The local API's trio server: the Unix socket, one task per connection, the op table and the handlers.

:mod:`.op_table` builds the one table of operations from the handler modules; :mod:`.api_server` serves it.
Handlers see the rest of the daemon through the narrow Protocols of :mod:`.api_ports` (never the engine
class, Membership or Replication). May import the shared messages, storage's ports, ``groups``, ``process``,
``host`` and the pure packages; never the composition root, ``services`` or the CLI.
"""
