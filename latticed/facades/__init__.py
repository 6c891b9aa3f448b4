"""The in-process library objects re-exported by :mod:`latticed`: :class:`~.lattice_queue.LatticeQueue`
and :class:`~.kv_namespace.KvNamespace`, the pure lattice with a clock and an owner's key attached.

May import the pure core (``crdt``), ``process`` (clock, logging) and the public errors; nothing of the
daemon (no storage, network, API or trio).
"""
