"""``python -m latticed ...`` is the ``latticed`` command (run, network-key, version)."""

from __future__ import annotations

from cli.daemon import main

if __name__ == "__main__":
    main()
