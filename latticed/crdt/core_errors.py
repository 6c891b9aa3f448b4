"""The one exception hierarchy of latticed.

It is rooted here, in the pure core, because ``crdt`` may import nothing else of ours; the rest of the
project re-exports it from :mod:`latticed.errors` and extends it there.
"""

from __future__ import annotations


class LatticedError(Exception):
    """Base of every error latticed raises on purpose; anything else is a bug."""

    #: Stable machine-readable code carried over the local API and shown by the CLI.
    code: str = "error"


class MalformedError(LatticedError):
    """Input that does not decode to a well-formed value (bad type, length, layout or version)."""

    code = "malformed"


class IntegrityError(LatticedError):
    """Input that decodes but fails verification: a signature, hash chain or ownership check."""

    code = "integrity"


class BadSignatureError(IntegrityError):
    """A signature does not verify under the claimed owner's key."""

    code = "bad_signature"


class WrongOwnerError(IntegrityError):
    """State for another queue or namespace (another key, or another name) was offered for merge."""

    code = "wrong_owner"


class TamperedError(IntegrityError):
    """Signed head is valid but the entries or metadata it vouches for do not match it."""

    code = "tampered"


class EquivocationError(IntegrityError):
    """A fork proof that does not prove a fork."""

    code = "bad_fork_proof"


class NotOwnerError(LatticedError):
    """A write (offer, truncate, set_meta, KV put) on a replica whose private key we do not hold."""

    code = "not_owner"


class GapError(LatticedError):
    """A delta that does not connect to what the replica holds; ask for an earlier suffix."""

    code = "gap"


class WrongTypeError(LatticedError):
    """A KV write that needs the key to hold one kind of value finds another: ``incr`` on a key holding a
    plain value, a hash or a set (Redis's WRONGTYPE). Nothing is written; the key keeps its value."""

    code = "wrong_type"


class NotReaderError(LatticedError):
    """A sealed queue or KV namespace whose content key this identity was not given (for the key epoch
    that sealed the records asked for): its records verify and replicate here, but do not decrypt."""

    code = "not_reader"
