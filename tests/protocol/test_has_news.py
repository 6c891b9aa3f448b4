"""``has_news`` compares summaries field by field, and whole only for forked ones: the same answers as the
definition that compared every pair whole first (kept here as the reference)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.crdt import queue2
from latticed.crdt.epoch_delta import LogSummary
from latticed.protocol.core2_session import has_news
from latticed.protocol.core2_wire import Summary2


def reference(ours: Summary2 | None, theirs: Summary2 | None) -> bool:
    """The definition before the cut (session 24's main)."""
    if ours is None or (not ours.core.log.known and not ours.core.held_end and not ours.heads):
        return False
    if theirs is None:
        return True
    if ours is theirs or ours == theirs:
        return False
    a, b = ours.core, theirs.core
    if a.log.epoch != b.log.epoch:
        return a.log.epoch > b.log.epoch
    if ours.heads or theirs.heads:
        return True
    covers_log = b.log.known > a.log.known or (b.log.known == a.log.known and b.log.fold == a.log.fold)
    covers_records = b.held_end > a.held_end or (b.held_end == a.held_end and b.held_hash == a.held_hash)
    return not (covers_log and covers_records)


# Small domains, so that equal and nearly equal pairs (the cases the cut changed) come up often.
summaries = st.builds(
    lambda epoch, known, fold, end, chain, heads: Summary2(
        queue2.Summary(LogSummary(epoch, known, fold), end, chain), heads
    ),
    st.integers(0, 1),
    st.integers(0, 2),
    st.sampled_from([b"a" * 32, b"b" * 32]),
    st.integers(0, 2),
    st.sampled_from([b"c" * 32, b"d" * 32]),
    st.sampled_from([b"", b"h" * 32, b"i" * 32]),
)


@settings(max_examples=2000, deadline=None)
@given(st.none() | summaries, st.none() | summaries)
def test_has_news_answers_as_the_whole_comparison_did(ours: Summary2 | None, theirs: Summary2 | None) -> None:
    assert has_news(ours, theirs) == reference(ours, theirs)


@given(summaries)
def test_an_equal_copy_is_no_news_and_the_same_object_neither(ours: Summary2) -> None:
    copy = Summary2(
        queue2.Summary(LogSummary(*_log(ours)), ours.core.held_end, ours.core.held_hash), ours.heads
    )
    assert copy is not ours
    assert not has_news(ours, copy)
    assert not has_news(ours, ours)


def test_forked_summaries_that_differ_only_in_their_heads_are_news() -> None:
    core = queue2.Summary(LogSummary(1, 2, b"a" * 32), 2, b"c" * 32)
    assert has_news(Summary2(core, b"h" * 32), Summary2(core, b"i" * 32))
    assert has_news(Summary2(core, b"h" * 32), Summary2(core))
    assert has_news(Summary2(core), Summary2(core, b"h" * 32))
    assert not has_news(Summary2(core, b"h" * 32), Summary2(core, b"h" * 32))


def _log(s: Summary2) -> tuple[int, int, bytes]:
    log = s.core.log
    return log.epoch, log.known, log.fold
