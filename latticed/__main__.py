"""``python -m latticed ...`` is the ``latticed`` command (run, network-key, migrate, version)."""

from __future__ import annotations

from cli.entry import latticed

if __name__ == "__main__":
    latticed()
