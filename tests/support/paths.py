"""Where the checkout is, for tests that read its files (docs, units, vectors): one definition, so a test
file can move between folders of tests/ without counting parents."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
