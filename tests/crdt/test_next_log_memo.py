"""``head2.next_log`` keeps the last heads it folded: whatever it answered from them is the fold of that
very head's leaf onto its log, for heads equal but distinct, heads differing in one field, and heads
pushed out of the memo and asked again."""

from __future__ import annotations

import dataclasses

from latticed.crdt import head2
from latticed.crdt.head2 import HeadV2, body_digest, fold_one, next_log

QID = bytes(range(32))


def _head(version: int, log: bytes = b"\x01" * 32) -> HeadV2:
    return HeadV2(QID, 0, version, log, 0, version, b"\x02" * 32, b"\x03" * 32, 0, b"\x04" * 32, 7)


def _fresh(head: HeadV2) -> bytes:
    """The fold computed afresh, as next_log did before it kept any."""
    return fold_one(head.log, body_digest(head.body()), head.end)


def test_every_answer_is_the_heads_own_fold_whether_kept_or_not() -> None:
    heads = [_head(v) for v in range(1, 12)]
    for _ in range(3):  # first folds, answers from the memo, then ones pushed out of it again
        for head in heads[: head2._NEXT_LOGS + 3]:
            assert next_log(head) == _fresh(head)
            assert next_log(head) == _fresh(head)
    assert len(head2._next_logs) <= head2._NEXT_LOGS


def test_heads_that_differ_in_one_field_get_their_own_fold() -> None:
    head = _head(3)
    other = dataclasses.replace(head, log=b"\x09" * 32)
    same = dataclasses.replace(head)
    assert next_log(head) != next_log(other)
    assert next_log(other) == _fresh(other)
    assert same is not head and next_log(same) == next_log(head) == _fresh(head)
