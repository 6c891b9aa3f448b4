"""Bundles: what one daemon holds, in a file another daemon verifies and merges with no network between
them (``latticectl bundle``). Sans-IO: :mod:`.format` encodes and decodes the file and the want file,
:mod:`.plan` decides what an export carries; the daemon side is :mod:`latticed.api.bundle_handlers`."""
