"""Bundles: what one daemon holds, in a file another daemon verifies and merges with no network between
them (``latticectl bundle``). Sans-IO: :mod:`.format` encodes and decodes the file and the want file,
:mod:`.plan` decides what an export carries; the daemon side is :mod:`latticed.api.server.bundle_handlers`.

May import the pure core (``crdt``) and ``protocol``'s pure helpers; no I/O, no clock, nothing of the
daemon (no storage, network, API, host or trio): the bytes and the time come in as arguments.
"""
