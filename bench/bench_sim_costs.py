"""The mesh simulator's per-operation CPU costs (``CORE2_COSTS``), measured: never fitted to its outcome.

    PYTHONPATH=$PWD flock /tmp/heavy.lock nice .venv/bin/python bench/bench_sim_costs.py --draws 0,1,2,3
    PYTHONPATH=$PWD .venv/bin/python bench/bench_sim_costs.py --draws 0 --daemons run1.log run2.log

Sans IO: the simulator's bulk (N = 8, core 2, 50k records in calls of 1,000, as bench_mesh offers them)
runs the daemons' own functions on real messages; each call of those is timed (``time.thread_time``,
with the GC settings a daemon runs with: ``_tune_gc_threshold`` and ``gc.freeze`` after the warm-up, as
``latticed.daemon`` does once serving; without them the collector's passes over the simulator's eight
nodes' heap cost a received message several times what it costs a daemon). Every received message is
then sealed and opened on a real ``SecureChannel`` pair (the transport's crypto). Printed: per operation
the calls, the total, and the simulator's cost fields from them (a small message's median as the fixed
part, the rest per byte or record).

``--daemons``: bench_mesh ``--metrics`` bulk logs (their CPU by thread): the replicas' storage threads'
CPU over the deltas and records they merged (least squares) and the writer's reader threads' per record
read, the part of a node's work the simulator does not run (the store's SQL, its reads).
"""

from __future__ import annotations

import argparse
import gc
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the simulator is a test helper

from support import mesh_sim2
from support.mesh_sim import bulk

from latticed.crdt import queue2
from latticed.daemon import _tune_gc_threshold
from latticed.protocol import core2_compact, core2_session, replication
from latticed.protocol.handshake import Initiator, Responder
from latticed.protocol.secure import SecureChannel

#: Per operation, each timed call's (size, CPU seconds): size in bytes or records, as the cost is.
Samples = dict[str, list[tuple[int, float]]]
#: Per label, whether a timed call of it is running (the outermost call is the sample).
_INSIDE: dict[str, list[bool]] = {}


def _timed(
    samples: Samples, on: list[bool], owner: Any, name: str, label: str, size: Callable[..., int]
) -> None:
    """Time each call of ``owner.name`` under ``label``; a call made inside another timed call of the same
    label is that call's part, not a sample of its own (``_encode`` of a DELTA2 calls ``encode_delta``)."""
    fn = getattr(owner, name)
    inside = _INSIDE.setdefault(label, [False])

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not on[0] or inside[0]:
            return fn(*args, **kwargs)
        inside[0] = True
        began = time.thread_time()
        try:
            out = fn(*args, **kwargs)
        finally:
            inside[0] = False
        samples[label].append((size(args, kwargs, out), time.thread_time() - began))
        return out

    setattr(owner, name, wrapper)


def measure(draw: int, records: int = 50_000) -> tuple[Samples, list[bytes]]:
    """Every timed call of the simulator's bulk of ``records`` (draw ``draw``) and the messages its nodes
    received."""
    samples: Samples = defaultdict(list)
    on = [False]
    received: list[bytes] = []
    originals = {
        (replication.ReplicationSession, "receive_message"): replication.ReplicationSession.receive_message,
        (core2_session.Core2Link, "_encode"): core2_session.Core2Link._encode,
        (core2_compact.Compact2Link, "encode_delta"): core2_compact.Compact2Link.encode_delta,
        (core2_session, "encode2"): core2_session.encode2,
        (mesh_sim2, "unpack_steps"): mesh_sim2.unpack_steps,
        (queue2, "verify_delta"): queue2.verify_delta,
        (queue2, "join_verified"): queue2.join_verified,
        (queue2, "commit"): queue2.commit,
    }
    _timed(
        samples, on, replication.ReplicationSession, "receive_message", "receive", lambda a, k, o: len(a[1])
    )
    # every message sent: ``_send``'s ``_encode``, and a DELTA2 that ``provide_delta`` packs directly
    # (relay27: the codec's ``encode_delta``, or ``encode2`` without the compact codec)
    _timed(samples, on, core2_session.Core2Link, "_encode", "encode", lambda a, k, o: len(o))
    _timed(samples, on, core2_compact.Compact2Link, "encode_delta", "encode", lambda a, k, o: len(o))
    _timed(samples, on, core2_session, "encode2", "encode", lambda a, k, o: len(o))
    _timed(samples, on, mesh_sim2, "unpack_steps", "unpack", lambda a, k, o: len(a[1].records))
    _timed(samples, on, queue2, "verify_delta", "verify", lambda a, k, o: len(a[1].records))
    _timed(samples, on, queue2, "join_verified", "join", lambda a, k, o: 0)
    _timed(samples, on, queue2, "commit", "sign", lambda a, k, o: len(k["records"]))
    timed_receive = replication.ReplicationSession.receive_message

    def keep(self: replication.ReplicationSession, payload: bytes, now: float = 0.0) -> None:
        if on[0]:
            received.append(bytes(payload))
        timed_receive(self, payload, now)

    replication.ReplicationSession.receive_message = keep  # type: ignore[method-assign]
    try:
        sim = mesh_sim2.MeshSim2(8, draws=draw)
        mesh_sim2.warm_up(sim)
        gc.collect()
        _tune_gc_threshold()
        gc.freeze()
        on[0] = True
        bulk(sim, records, 100)
        on[0] = False
    finally:
        for (owner, name), fn in originals.items():
            setattr(owner, name, fn)
        gc.unfreeze()
    initiator = Initiator(seed=b"\x11" * 32, network_key=bytes(32), now_ms=1_700_000_000_000)
    responder = Responder(seed=b"\x22" * 32, network_key=bytes(32), now_ms=1_700_000_000_000)
    initiator.receive_data(
        responder.receive_data(initiator.receive_data(responder.receive_data(initiator.initiate())))
    )
    sender = SecureChannel(initiator.result, max_message_size=1 << 22)
    opener = SecureChannel(responder.result, max_message_size=1 << 22)
    for message in received:
        began = time.thread_time()
        frame = sender.seal(message)
        samples["seal"].append((len(message), time.thread_time() - began))
        began = time.thread_time()
        opener.receive_data(frame)
        assert opener.next_message() == message
        samples["open"].append((len(message), time.thread_time() - began))
    return samples, received


def _small(samples: list[tuple[int, float]]) -> float:
    """A small message's CPU (the median of those under 500 B: ACK2s, HAVE2s), the fixed part."""
    return statistics.median(s for n, s in samples if n < 500)


def costs(samples: Samples) -> dict[str, float]:
    """The simulator's cost fields from one draw's samples (seconds; per byte or record as named)."""
    total = {k: sum(s for _, s in v) for k, v in samples.items()}
    size = {k: sum(n for n, _ in v) for k, v in samples.items()}
    calls = {k: len(v) for k, v in samples.items()}
    message = _small(samples["receive"]) + _small(samples["open"])
    small_encode, small_seal = _small(samples["encode"]), _small(samples["seal"])
    cut = small_encode + small_seal
    records = size["verify"]
    per_record_bytes = size["receive"] / records  # the bulk's received bytes a record carried
    # the fixed part of a check: verify_delta's intercept over the deltas' sizes (one batch's signature)
    xs, ys = [n for n, _ in samples["verify"]], [s for _, s in samples["verify"]]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    verify = my - slope * mx
    return {
        "message": message,
        "message_byte": (total["receive"] + total["open"] - calls["receive"] * message) / size["receive"],
        "cut": cut,
        # the rest of every sent message's encode and seal, per byte sent (the seals': every message once)
        # at the bulk's bytes a record; each part's fixed cost by its own calls
        "cut_record": (
            total["encode"] + total["seal"] - calls["encode"] * small_encode - calls["seal"] * small_seal
        )
        / size["seal"]
        * per_record_bytes,
        "verify": verify,
        "verify_record": (total["unpack"] + total["verify"] - calls["verify"] * verify) / records,
        "join_record": total["join"] / records,  # one join a verified delta
        "sign_record": total["sign"] / size["sign"],
        "bytes_a_record": per_record_bytes,
    }


def daemons(logs: list[Path]) -> dict[str, float]:
    """From bench_mesh ``--metrics`` bulk logs: the replicas' storage CPU per delta and per record merged
    (least squares over every replica of every log) and the writer's reader threads' per record read."""
    points, reads = [], []
    for log in logs:
        text = log.read_text()
        threads = re.search(r"CPU/record by thread \(the writer first\): (.*)", text)
        if threads is None or "readers" not in threads.group(1):  # the split by thread names
            continue
        records = int(
            re.search(r"bulk \([\d.]+ s until every replica held them\): ([\d,]+) records", text)[1].replace(
                ",", ""
            )
        )  # type: ignore[index]
        carried = {
            m[1]: float(m[2]) for m in re.finditer(r"replica (n\d+):.*DELTA2 records/record ([\d.]+)", text)
        }
        deltas = {m[1]: float(m[2]) for m in re.finditer(r"replica (n\d+):.*delta2 ([\d.e-]+) \(", text)}
        sent = re.search(r"transactions committed per daemon \(the writer first\): n0 (\d+)/", text)
        for part in threads.group(1).split("; "):
            name = part.split()[0]
            role = {
                m[1]: float(m[2]) * 1e-6 * records for m in re.finditer(r"(\w+) (-?[\d.]+)(?= \+|$)", part)
            }
            if name in carried:
                points.append((deltas.get(name, 0.0) * records, carried[name] * records, role["storage"]))
            elif name == "n0" and sent is not None:
                reads.append(
                    role["readers"] / (int(sent[1]) * 1000)
                )  # each a chunk: one call's 1,000 records
    # storage = merge x deltas + per_record x records, least squares (two unknowns: the normal equations)
    sxx = sum(d * d for d, _, _ in points)
    sxy = sum(d * r for d, r, _ in points)
    syy = sum(r * r for _, r, _ in points)
    sxz = sum(d * s for d, _, s in points)
    syz = sum(r * s for _, r, s in points)
    det = sxx * syy - sxy * sxy
    return {
        "points": float(len(points)),
        "storage_per_delta": (sxz * syy - syz * sxy) / det,
        "storage_per_record": (sxx * syz - sxy * sxz) / det,
        "read_record": statistics.mean(reads) if reads else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--draws", default="0", help="the simulator's draws, comma-separated")
    parser.add_argument("--daemons", nargs="*", type=Path, default=[], help="bench_mesh --metrics bulk logs")
    args = parser.parse_args()
    rows = []
    for draw in [int(d) for d in args.draws.split(",")]:
        samples, _ = measure(draw)
        row = costs(samples)
        rows.append(row)
        print(
            f"draw {draw}: "
            + ", ".join(f"{k} {len(v)} calls {sum(s for _, s in v):.3f} s" for k, v in samples.items())
        )
        print("    " + ", ".join(f"{k} {v:.4g}" for k, v in row.items()))
    print("mean: " + ", ".join(f"{k} {statistics.mean(r[k] for r in rows):.4g}" for k in rows[0]))
    if args.daemons:
        found = daemons(args.daemons)
        print("daemons: " + ", ".join(f"{k} {v:.4g}" for k, v in found.items()))


if __name__ == "__main__":
    main()
