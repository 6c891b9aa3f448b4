"""``python -m latticed run --data-dir D --socket S``: run the daemon without the CLI package."""

from __future__ import annotations

import sys

from latticed.daemon import main

if __name__ == "__main__":
    sys.exit(main())
