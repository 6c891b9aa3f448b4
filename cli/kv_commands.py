"""``latticectl kv``: this daemon's signed key-value state, and other identities' replicated here.

One convention addresses another identity's namespace everywhere: ``OWNER/KEY`` (``OWNER/PREFIX`` for
``kv list``), as ``OWNER/NAME`` does for queues. The part before the first ``/`` counts as an owner only
when it is a 64-hex-digit public key, so ``config/db`` is an ordinary key of yours. ``kv list --owner``
is still accepted, for scripts written before. Writes go to your own namespace only.
"""

from __future__ import annotations

from typing import Annotated

import typer

from cli.common import JsonFlag, client, found, is_owner_hex, note, split_owner, to_bytes
from cli.output import emit, human, text_of_bytes

kv_app = typer.Typer(help="Signed key-value state: values, hashes, sets and counters.", no_args_is_help=True)

OwnKey = Annotated[str, typer.Argument(metavar="KEY", help="One of your own keys.")]
AnyKey = Annotated[
    str, typer.Argument(metavar="[OWNER/]KEY", help="Your key, or OWNER/KEY for another identity's.")
]
Value = Annotated[str, typer.Argument(metavar="VALUE", help="Stored as its UTF-8 bytes.")]
Field = Annotated[str, typer.Argument(metavar="FIELD", help="Hash field.")]
Member = Annotated[str, typer.Argument(metavar="MEMBER", help="Set member.")]


def _value_lines(value: object) -> list[str]:
    """A KV value as text: bytes as is, a set one member a line, a hash ``FIELD<TAB>VALUE`` lines."""
    if isinstance(value, bytes):
        return [text_of_bytes(value)]
    if isinstance(value, dict):
        return [f"{human(k)}\t{human(v)}" for k, v in sorted(value.items())]
    if isinstance(value, set | frozenset):
        return [human(m) for m in sorted(value)]
    return [human(value)]


@kv_app.command("put")
def kv_put(
    ctx: typer.Context,
    key: OwnKey,
    value: Value,
    ttl: Annotated[
        float | None,
        typer.Option("--ttl", metavar="SECONDS", help="Expire the key after SECONDS.", show_default="never"),
    ] = None,
) -> None:
    """Set a key to VALUE."""
    if ttl is not None and ttl <= 0:
        raise typer.BadParameter("must be > 0", ctx=ctx, param_hint="'--ttl'")
    data = to_bytes(value)
    client(ctx).kv_put(key, data, ttl=ttl)
    size = f"{len(data)} byte{'' if len(data) == 1 else 's'}"
    note(f"set {key!r} ({size}{'' if ttl is None else f', expires in {ttl:g}s'})")


@kv_app.command("get")
def kv_get(ctx: typer.Context, key: AnyKey, as_json: JsonFlag = False) -> None:
    """Print a key's value (a counter, hash or set is printed as such)."""
    owner, name = split_owner(key)
    value = found(client(ctx).kv_get(name, owner=owner), f"no key {key!r}")
    emit({"key": key, "value": value}, _value_lines(value), as_json=as_json)


@kv_app.command("del")
def kv_del(ctx: typer.Context, key: OwnKey) -> None:
    """Delete one of your keys (a key that is not set is not an error)."""
    client(ctx).kv_del(key)
    note(f"deleted {key!r} (if it was set)")


@kv_app.command("list")
def kv_list(
    ctx: typer.Context,
    prefix: Annotated[
        str,
        typer.Argument(
            metavar="[OWNER/]PREFIX",
            help="Only keys starting with PREFIX; OWNER/PREFIX (or OWNER/) for another identity's keys.",
        ),
    ] = "",
    owner: Annotated[
        str | None,
        typer.Option("--owner", metavar="OWNER", help="Another identity's keys: same as OWNER/PREFIX."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """List keys and values, one KEY<TAB>VALUE a line."""
    named, prefix = split_owner(prefix, allow_empty=True)
    if owner is not None:
        if not is_owner_hex(owner):
            raise typer.BadParameter(
                f"{owner!r} is not a public key (64 hex digits)", ctx=ctx, param_hint="'--owner'"
            )
        if named is not None and named != owner.lower():
            raise typer.BadParameter("names two owners: give OWNER/PREFIX or --owner", ctx=ctx)
        named = owner.lower()
    items = client(ctx).kv_list(prefix, owner=named)
    emit(items, [f"{k}\t{human(v)}" for k, v in sorted(items.items())], as_json=as_json)
    if not items and not as_json:
        starting = f" starting with {prefix!r}" if prefix else ""
        note(f"no keys{starting}{'' if named is None else f' in the namespace of {named}'}")


@kv_app.command("hset")
def kv_hset(ctx: typer.Context, key: OwnKey, field: Field, value: Value) -> None:
    """Set FIELD of the hash at KEY."""
    client(ctx).kv_hset(key, to_bytes(field), to_bytes(value))
    note(f"set field {field!r} of hash {key!r}")


@kv_app.command("hget")
def kv_hget(ctx: typer.Context, key: AnyKey, field: Field, as_json: JsonFlag = False) -> None:
    """Print FIELD of the hash at KEY."""
    owner, name = split_owner(key)
    value = found(client(ctx).kv_hget(name, to_bytes(field), owner=owner), f"no field {field!r} in {key!r}")
    emit({"key": key, "field": field, "value": value}, text_of_bytes(value), as_json=as_json)


@kv_app.command("hgetall")
def kv_hgetall(ctx: typer.Context, key: AnyKey, as_json: JsonFlag = False) -> None:
    """Print every field of the hash at KEY, one FIELD<TAB>VALUE a line."""
    owner, name = split_owner(key)
    fields = client(ctx).kv_hgetall(name, owner=owner)
    emit(fields, _value_lines(fields), as_json=as_json)
    if not fields and not as_json:
        note(f"no hash fields at {key!r}")


@kv_app.command("hdel")
def kv_hdel(ctx: typer.Context, key: OwnKey, field: Field) -> None:
    """Delete FIELD from the hash at KEY."""
    client(ctx).kv_hdel(key, to_bytes(field))
    note(f"deleted field {field!r} of hash {key!r} (if it was set)")


@kv_app.command("sadd")
def kv_sadd(ctx: typer.Context, key: OwnKey, member: Member) -> None:
    """Add MEMBER to the set at KEY."""
    client(ctx).kv_sadd(key, to_bytes(member))
    note(f"added {member!r} to set {key!r}")


@kv_app.command("srem")
def kv_srem(ctx: typer.Context, key: OwnKey, member: Member) -> None:
    """Remove MEMBER from the set at KEY."""
    client(ctx).kv_srem(key, to_bytes(member))
    note(f"removed {member!r} from set {key!r} (if it was there)")


@kv_app.command("smembers")
def kv_smembers(ctx: typer.Context, key: AnyKey, as_json: JsonFlag = False) -> None:
    """Print the members of the set at KEY, one a line, sorted."""
    owner, name = split_owner(key)
    members = client(ctx).kv_smembers(name, owner=owner)
    emit(members, _value_lines(members), as_json=as_json)
    if not members and not as_json:
        note(f"no set members at {key!r}")


@kv_app.command("incr")
def kv_incr(
    ctx: typer.Context,
    key: OwnKey,
    by: Annotated[int, typer.Option("--by", help="Amount to add (may be negative).", show_default=True)] = 1,
    as_json: JsonFlag = False,
) -> None:
    """Add to the counter at KEY (a missing key counts as 0); prints the new value.

    Exits 12 if KEY holds a plain value, a hash or a set (nothing is written)."""
    total = client(ctx).kv_incr(key, by=by)
    emit({"key": key, "value": total}, str(total), as_json=as_json)


Reader = Annotated[str, typer.Argument(metavar="ID", help="A reader's identity (latticectl id on it).")]


@kv_app.command("seal")
def kv_seal(
    ctx: typer.Context,
    readers: Annotated[
        str,
        typer.Option("--readers", metavar="ID,ID", help="Identities that may read it besides this daemon."),
    ] = "",
) -> None:
    """Make your KV namespace sealed: only its readers read its keys and values, other daemons relay its
    ops encrypted (docs/privacy.md). Only before your first KV write; exits 8 after it."""
    ids = [r.strip() for r in readers.split(",") if r.strip()]
    done = client(ctx).kv_seal(ids)
    note(f"sealed KV namespace {done['namespace']} (readers: this daemon{''.join(', ' + r for r in ids)})")


@kv_app.command("share")
def kv_share(ctx: typer.Context, reader: Reader) -> None:
    """Let another identity read your sealed KV namespace (all of it: a view needs every op)."""
    epochs = client(ctx).kv_share(reader)
    note(
        f"shared key epoch(s) {', '.join(map(str, epochs))} with {reader}"
        if epochs
        else f"{reader} reads it already"
    )


@kv_app.command("unshare")
def kv_unshare(ctx: typer.Context, reader: Reader) -> None:
    """Stop an identity reading your sealed KV namespace: writes from now on use a new key."""
    done = client(ctx).kv_unshare(reader)
    note(f"removed {reader}: key epoch {done['epoch']}" if done["removed"] else f"{reader} is not a reader")


__all__ = ["kv_app"]
