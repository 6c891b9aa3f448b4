"""The owner's journal format (latticed/storage/journal.py): a tail torn anywhere replays to the last whole
entry, and an entry whose signature fails is refused and reported, never replayed."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from latticed.crdt import queue2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.storage import journal
from latticed.storage.journal import Entry

ALICE = Identity.from_seed(b"a" * 32)
MALLORY = Identity.from_seed(b"m" * 32)
SALT = bytes(range(16))


def _batches(name: str, sizes: list[int], identity: Identity = ALICE) -> list[Entry]:
    """Real signed batches of one queue: each entry's records and the head ``queue2.commit`` signed."""
    state = queue2.empty_state(identity.public_key, name)
    entries, first = [], 0
    for n, size in enumerate(sizes):
        records = tuple(
            Record(
                b"v%d" % (first + i),
                b"k" if i % 2 else None,
                1_700_000_000_000 + n,
                (("h", b"x"),) if i % 3 == 0 else (),
            )
            for i in range(size)
        )
        state = queue2.commit(state, identity, now_ms=n + 1, records=records)
        entries.append(Entry(state.queue_id, first, records, state.bodies[-1].to_bytes()))
        first += size
    return entries


def _file(entries: list[Entry], salt: bytes = SALT) -> tuple[bytes, list[int]]:
    """The journal's bytes and the offset after each entry."""
    data, ends = bytearray(journal.header(salt)), []
    for seq, entry in enumerate(entries, 1):
        data += journal.frame(salt, seq, entry)
        ends.append(len(data))
    return bytes(data), ends


def test_entries_come_back_as_written() -> None:
    entries = _batches("q", [1, 16, 3])
    data, ends = _file(entries)
    found = journal.scan(data)
    assert (found.salt, found.entries, found.end, found.torn, found.malformed) == (
        SALT,
        entries,
        ends[-1],
        False,
        None,
    )


def test_a_journal_torn_at_every_byte_offset_scans_to_the_last_whole_entry() -> None:
    entries = _batches("q", [1, 16, 2, 5])
    data, ends = _file(entries)
    for cut in range(len(data) + 1):
        whole = sum(1 for end in ends if end <= cut)
        found = journal.scan(data[:cut])
        assert found.entries == entries[:whole], cut
        if cut < journal.HEADER_SIZE:
            assert found.salt is None and found.end == 0, cut
        else:
            assert found.end == (ends[whole - 1] if whole else journal.HEADER_SIZE), cut
            # The preallocated file: zeros past the cut are a clean end, anything else is reported torn.
            padded = journal.scan(data[:cut] + bytes(4096))
            assert padded.entries == entries[:whole] and padded.torn == (cut != padded.end), cut


def test_garbage_or_an_older_salts_entries_past_the_tail_end_the_scan() -> None:
    entries = _batches("q", [4, 4, 4])
    data, ends = _file(entries[:2])
    older, _ = _file(_batches("q", [4, 4, 4, 4]), salt=b"\xff" * 16)
    rng = random.Random(7)
    for tail in (older[ends[-1] :], bytes(rng.randrange(256) for _ in range(600)), b"\x00" * 12 + b"\x01"):
        found = journal.scan(data + tail)
        assert found.entries == entries[:2] and found.end == ends[-1] and found.torn


def test_a_flipped_bit_anywhere_in_an_entry_ends_the_scan_before_it() -> None:
    entries = _batches("q", [2, 3, 2])
    data, ends = _file(entries)
    for offset in range(ends[0], ends[1]):  # every byte of the second frame
        for bit in (0x01, 0x80):
            damaged = bytearray(data)
            damaged[offset] ^= bit
            found = journal.scan(bytes(damaged))
            assert found.entries == entries[:1] and found.end == ends[0] and found.torn, (offset, bit)


def test_a_damaged_header_holds_no_entries() -> None:
    data, _ = _file(_batches("q", [3]))
    for offset in range(journal.HEADER_SIZE):
        damaged = bytearray(data)
        damaged[offset] ^= 0x10
        found = journal.scan(bytes(damaged))
        assert found.salt is None and found.entries == [] and found.torn, offset


def test_a_checksummed_frame_that_does_not_decode_is_reported_not_raised() -> None:
    data = bytearray(journal.header(SALT))
    body = b"\x93\x01\x02\x03"  # msgpack [1, 2, 3]: not an entry
    data += journal._FRAME.pack(len(body), 1, journal._crc(SALT, len(body), 1, body)) + body
    found = journal.scan(bytes(data))
    assert found.entries == [] and found.end == journal.HEADER_SIZE and found.malformed is not None


def test_replay_takes_entries_past_the_stores_end_and_skips_what_it_holds() -> None:
    entries = _batches("q", [2, 3, 4])
    qid = entries[0].queue_id
    for stored, replayed in ((0, 3), (2, 2), (5, 1), (9, 0)):
        plan = journal.plan(entries, ALICE.public_key, {qid: stored}.get)
        assert [entry for entry, _ in plan.replay] == entries[3 - replayed :], stored
        assert plan.skipped == 3 - replayed and plan.refused == []
        assert [head.end for _, head in plan.replay] == [2, 5, 9][3 - replayed :]


def test_an_entry_whose_signature_fails_is_refused_and_reported_with_the_rest_of_its_queue() -> None:
    entries = _batches("q", [2, 3, 4])
    other = _batches("r", [1, 1])
    qid = entries[0].queue_id
    raw = bytearray(entries[1].head)
    raw[-1] ^= 0x01  # one bit of the signature
    forged = dataclasses.replace(entries[1], head=bytes(raw))
    mixed = [entries[0], other[0], forged, other[1], entries[2]]
    data, _ = _file(mixed)  # a whole, checksummed frame: only the signature check can refuse it
    found = journal.scan(data)
    assert found.entries == mixed
    plan = journal.plan(found.entries, ALICE.public_key, {qid: 0, other[0].queue_id: 0}.get)
    assert [entry for entry, _ in plan.replay] == [entries[0], other[0], other[1]]
    assert [(r.queue_id, r.first) for r in plan.refused] == [(qid, 2), (qid, 5)]
    assert "signature" in plan.refused[0].reason.lower() and "refused" in plan.refused[1].reason


def test_another_owners_head_or_a_head_for_another_queue_is_refused() -> None:
    mine, theirs = _batches("q", [2]), _batches("q", [2], identity=MALLORY)
    qid = mine[0].queue_id
    swapped = dataclasses.replace(theirs[0], queue_id=qid)  # Mallory's head for Alice's queue id
    plan = journal.plan([swapped], ALICE.public_key, {qid: 0}.get)
    assert plan.replay == [] and len(plan.refused) == 1
    moved = dataclasses.replace(mine[0], queue_id=_batches("r", [2])[0].queue_id)
    plan = journal.plan([moved], ALICE.public_key, lambda _: 0)
    assert plan.replay == [] and "another queue" in plan.refused[0].reason


def test_a_gap_a_short_entry_or_an_unknown_queue_is_refused_not_replayed() -> None:
    entries = _batches("q", [2, 3])
    qid = entries[0].queue_id
    gap = journal.plan(
        entries[1:], ALICE.public_key, {qid: 0}.get
    )  # the store lost more than the journal holds
    assert gap.replay == [] and "starts at 2" in gap.refused[0].reason
    short = dataclasses.replace(entries[0], records=entries[0].records[:1])
    cut = journal.plan([short, entries[1]], ALICE.public_key, {qid: 0}.get)
    assert cut.replay == [] and len(cut.refused) == 2
    unknown = journal.plan(entries, ALICE.public_key, lambda _: None)
    assert unknown.replay == [] and "no such queue" in unknown.refused[0].reason


@pytest.mark.parametrize("salt", [b"", b"x" * 15, b"x" * 17])
def test_a_salt_is_sixteen_bytes(salt: bytes) -> None:
    with pytest.raises(ValueError):
        journal.header(salt)


def test_a_journal_file_appends_in_preallocated_space_and_reopens_where_it_ended(tmp_path: Path) -> None:
    entries = _batches("q", [1, 16, 2, 5, 3])
    path = str(tmp_path / "journal")
    file, found = journal.JournalFile.open(path, salt=SALT, chunk=100)  # a chunk smaller than a frame
    assert found.salt is None and found.entries == []
    file.append(entries[:2])
    file.append(entries[2:3])
    size = os.path.getsize(path)
    assert size >= file.end and size % 100 == 0 and size - file.end < 100
    file.close()
    again, found = journal.JournalFile.open(path, salt=b"\xee" * 16)
    assert found.salt == SALT and found.entries == entries[:3] and not found.torn
    again.append(entries[3:])  # numbered after the three already there
    again.close()
    assert journal.scan(Path(path).read_bytes()).entries == entries


def test_starting_over_forgets_every_entry_and_the_old_ones_past_the_tail_stay_out(tmp_path: Path) -> None:
    old, new = _batches("q", [4, 4, 4]), _batches("r", [1])
    path = str(tmp_path / "journal")
    file, _ = journal.JournalFile.open(path, salt=SALT)
    file.append(old)
    file.start_over(b"\x01" * 16)
    file.append(new)  # shorter than the old entries it overwrites
    file.close()
    found = journal.scan(Path(path).read_bytes())
    assert found.salt == b"\x01" * 16 and found.entries == new and found.torn


_CHILD = """
import sys
from latticed.storage import journal
from tests_journal_entries import entries
file, _ = journal.JournalFile.open(sys.argv[1], salt=bytes(range(16)), chunk=512)
for n, entry in enumerate(entries, 1):
    file.append([entry])
    sys.stdout.write(f"{n}\\n")  # the ack: only after the append's fdatasync returned
    sys.stdout.flush()
"""


def test_a_process_killed_while_appending_keeps_every_acked_entry(tmp_path: Path) -> None:
    entries = _batches("q", [3] * 400)
    (tmp_path / "tests_journal_entries.py").write_text(
        "from latticed.crdt.records import Record\nfrom latticed.storage.journal import Entry\n"
        f"entries = {entries!r}\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    for stop_after in (1, 57, 233):
        path = str(tmp_path / f"journal{stop_after}")
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, path], stdout=subprocess.PIPE, env=env, text=True
        )
        assert child.stdout is not None
        acked = 0
        while acked < stop_after:
            acked = int(child.stdout.readline())
        child.send_signal(signal.SIGKILL)  # while it appends the next entries
        assert child.wait() == -signal.SIGKILL  # killed, not finished
        found = journal.scan(Path(path).read_bytes())
        assert len(found.entries) >= acked and found.entries == entries[: len(found.entries)], stop_after


def test_a_file_whose_header_was_torn_is_reported_and_started_over(tmp_path: Path) -> None:
    entries = _batches("q", [2, 2])
    path = tmp_path / "journal"
    file, _ = journal.JournalFile.open(str(path), salt=SALT)
    file.append(entries)
    file.close()
    damaged = bytearray(path.read_bytes())
    damaged[20] ^= 0xFF  # inside the salt: as a power loss tearing a start-over's header
    path.write_bytes(bytes(damaged))
    again, found = journal.JournalFile.open(str(path), salt=b"\x02" * 16)
    assert found.salt is None and found.entries == [] and found.torn  # for the caller to report
    again.append(entries[1:])
    again.close()
    after = journal.scan(path.read_bytes())
    assert after.salt == b"\x02" * 16 and after.entries == entries[1:]
