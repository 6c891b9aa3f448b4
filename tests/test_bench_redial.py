"""bench_redial: on this tree a redial after the half-open link we dialled is kept at once (well under
the 20 s a stale link took), measured on trio's mock clock."""

from __future__ import annotations

import sys

from support.paths import ROOT

sys.path.append(str(ROOT / "bench"))  # bench/ is no package (its benches are scripts); last: shadows nothing
import bench_redial


def test_the_owner_is_linked_again_within_its_first_redial() -> None:
    waits, walls = bench_redial.run(2)
    assert len(walls) == 2 and all(wait < 1.0 for wait in waits)
