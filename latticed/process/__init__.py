"""Process plumbing every layer may use: the wall clock, structured logging, the shared periodic tick,
OS thread names, the allocator's trim policy and systemd's ``sd_notify``.

Imports nothing of ours but :mod:`latticed.errors` (the public errors, which re-export the core's); only
:mod:`.ticks` needs trio.
"""
