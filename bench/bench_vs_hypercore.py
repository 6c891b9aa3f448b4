"""Live propagation over one hop, latticed against Hypercore 11, interleaved in one sitting.

    (cd bench/hypercore && npm ci)      # once: Hypercore 11 and its dependencies, pinned by package-lock
    .venv/bin/python bench/bench_vs_hypercore.py                   # 3 rounds x 300 records, 10 ms apart
    .venv/bin/python bench/bench_vs_hypercore.py --rounds 5 --variants default

Each round runs Hypercore's live run (``bench/hypercore/live.mjs``: a writer process appending one 100 B
block, then sleeping ``--interval``, and a reader process replicating it over TCP on 127.0.0.1, timing
each block from the writer's append start to the reader's get()), once per ``--variants`` entry, then
latticed's: ``bench_replication.live`` itself (offer call on the writer -> tail on the peer, the figure
in bench/RESULTS.md), with the same interval and sample count and ``--hops 1`` by default (two
daemons, like Hypercore's two processes). Rounds alternate ABAB so that a noisy minute on the shared host
lands on both. Every latency is read on CLOCK_MONOTONIC (time.perf_counter here, process.hrtime in
Node), so figures from different processes compare directly.

Durability is not the same on both sides: latticed's writer fsyncs a record before anything sees it;
Hypercore's append is a RocksDB write without sync (the ``default`` variant), and even the ``fsync``
variant (the writer fdatasyncs RocksDB's WAL after each append) replicates the block before that flush.
See live.mjs for what each figure means.

Figures are printed, never asserted. Not a test: nothing under tests/ runs it, and it needs Node.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from bench_replication import live
from hostjitter import FsyncProbe, WakeProbe

HERE = Path(__file__).resolve().parent / "hypercore"


def figures(lat: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 / max of latencies in ms, with bench_replication's rank rule for the tail."""
    s = sorted(lat)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(len(s) * p))]

    return {"p50": statistics.median(s), "p90": q(0.90), "p99": q(0.99), "max": s[-1]}


def show(label: str, lat: list[float]) -> dict[str, float]:
    f = figures(lat)
    cells = ", ".join(f"{k} {v:.2f}" for k, v in f.items())
    print(f"  {label:<46} {cells} ms ({len(lat)})")
    return f


def ratios(ours: dict[str, float], theirs: dict[str, float]) -> str:
    return ", ".join(f"{k} {ours[k] / theirs[k]:.2f}x" for k in ("p50", "p90", "p99", "max"))


def hypercore(node: str, variant: str, samples: int, interval: float) -> dict[str, list[float]]:
    """One live.mjs run, bracketed by the host probes (each in a process of its own, as latticed's live
    part does), so each side's figures come with the host's own floor from the same minutes."""
    command = [node, "live.mjs", "--samples", str(samples), "--interval", f"{interval * 1000:g}"]
    scratch = Path(tempfile.mkdtemp(prefix="hc-probe-"))
    try:
        with WakeProbe() as probe, FsyncProbe(scratch) as disk:
            done = subprocess.run(
                [*command, "--variant", variant],
                cwd=HERE,
                capture_output=True,
                text=True,
                timeout=120 + samples * interval * 10,
                check=False,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"live.mjs --variant {variant} failed ({done.returncode}):\n{done.stderr}")
    result: dict[str, list[float]] = json.loads(done.stdout)
    print(f"    {probe.summary()}")
    print(f"    {disk.summary()}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--interval", type=float, default=0.01, help="seconds between records")
    parser.add_argument("--variants", default="default,fsync", help="Hypercore: default, fsync or both")
    parser.add_argument("--hops", type=int, default=1, choices=range(1, 8), help="latticed's chain length")
    parser.add_argument("--node", default="node")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if not set(variants) <= {"default", "fsync"}:
        parser.error("--variants takes default and/or fsync")
    if not (HERE / "node_modules" / "hypercore").is_dir():
        raise SystemExit(f"Hypercore is not installed: run `npm ci` in {HERE}")
    version = json.loads((HERE / "node_modules" / "hypercore" / "package.json").read_text())["version"]
    node_version = subprocess.run([args.node, "--version"], capture_output=True, text=True, check=True)

    print(
        f"live propagation, one hop, {args.samples} records {args.interval * 1000:g} ms apart, "
        f"{args.rounds} rounds; Hypercore {version} on Node {node_version.stdout.strip()}"
    )
    pooled: dict[str, list[float]] = {}
    per_round: dict[str, list[dict[str, float]]] = {}
    labels: dict[str, str] = {}

    def keep(key: str, label: str, lat: list[float]) -> None:
        labels[key] = label
        pooled.setdefault(key, []).extend(lat)
        per_round.setdefault(key, []).append(show(label, lat))

    for r in range(1, args.rounds + 1):
        print(f"round {r}")
        for variant in variants:
            print(f"  Hypercore ({variant}):")
            hc = hypercore(args.node, variant, args.samples, args.interval)
            keep(f"hc-{variant}", f"hypercore {variant}: append -> reader get()", hc["latency_ms"])
            keep(f"hc-{variant}-append", f"hypercore {variant}: append() on the writer", hc["append_ms"])
            if hc["durable_ms"]:
                keep(f"hc-{variant}-durable", f"hypercore {variant}: append -> WAL durable", hc["durable_ms"])
                keep(f"hc-{variant}-held", f"hypercore {variant}: max(reader, durable)", hc["held_ms"])
        print(f"  latticed ({args.hops} hop{'s' if args.hops > 1 else ''}, bench_replication.live):")
        ours = live(args.samples, args.interval, args.hops, floor=False)
        keep("ld-base", "latticed: offer -> tail on the writer (baseline)", ours["A"])
        keep("ld-1hop", "latticed: offer -> tail on the peer (1 hop)", ours["B"])
        for variant in variants:
            mine, theirs = per_round["ld-1hop"][-1], per_round[f"hc-{variant}"][-1]
            print(f"  ratio latticed 1 hop / hypercore {variant}: {ratios(mine, theirs)}")

    print(f"overall ({args.rounds} rounds pooled, {args.samples} records each)")
    overall = {key: show(labels[key], lat) for key, lat in pooled.items()}
    for variant in variants:
        key = f"hc-{variant}"
        median50 = statistics.median(
            a["p50"] / b["p50"] for a, b in zip(per_round["ld-1hop"], per_round[key], strict=True)
        )
        median99 = statistics.median(
            a["p99"] / b["p99"] for a, b in zip(per_round["ld-1hop"], per_round[key], strict=True)
        )
        pooled_ratios = ratios(overall["ld-1hop"], overall[key])
        print(
            f"  ratio latticed 1 hop / hypercore {variant}: pooled {pooled_ratios}; "
            f"median of rounds p50 {median50:.2f}x, p99 {median99:.2f}x"
        )


if __name__ == "__main__":
    main()
