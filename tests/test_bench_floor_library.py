"""bench/floor_offers.py's ``--library`` row: the floor's server speaking latticed's frames answers
latticed's own ``Client``, durably (after its fdatasync) and in request order, and the floor's own row is
the raw one it always was."""

from __future__ import annotations

import sys

from support.paths import ROOT

sys.path.append(str(ROOT / "bench"))  # bench/ is no package (its benches are scripts); last: shadows nothing
import floor_offers


def test_the_floor_answers_latticeds_client_and_keeps_its_raw_row() -> None:
    rate, server_cpu, client_cpu = floor_offers.measure(1, 0.3, durable=True, library=True)
    assert rate > 0 and server_cpu > 0 and client_cpu > 0  # every offer acked (Client checks each id)
    rate, _, _ = floor_offers.measure(1, 0.3, durable=True)
    assert rate > 0
