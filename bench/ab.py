#!/usr/bin/env python3
"""Alternating A/B runs of two idem builds under one workload, and their medians.

    bench/ab.py A_BIN B_BIN --workload empty --backend postgres --rounds 3 --duration 10

Runs `idem-lab bench` (target/release/idem-lab, or --lab) with `--idem-bin A_BIN`, then
with B_BIN, `--rounds` times (A first in odd rounds, B first in even ones, so a drift in
the machine's speed favours neither), fresh databases every run, and prints each run and
the medians of throughput, coordinator CPU per transaction, p99 and peak RSS. The load
generator and the participants are the same binary for both; only the coordinator
differs. This machine's speed swings from one run to the next: read the medians, and the
pairs.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(lab, idem_bin, args):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [
        lab, "bench",
        "--workload", args.workload,
        "--backend", args.backend,
        "--clients", str(args.clients),
        "--duration", str(args.duration),
        "--warmup", str(args.warmup),
        "--count", "0",
        "--idem-bin", idem_bin,
        "--json", out,
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        result = json.load(f)
    os.unlink(out)
    tx = max(result["transactions"], 1)
    return {
        "per_second": result["per_second"],
        "cpu_ms": 1000.0 * result["coordinator_cpu_seconds"] / tx,
        "p99_ms": result["p99_ms"],
        "rss_mb": result["coordinator_peak_rss_mb"],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--lab", default="target/release/idem-lab")
    p.add_argument("--workload", default="empty")
    p.add_argument("--backend", default="postgres")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    runs = {"A": [], "B": []}
    for r in range(args.rounds):
        order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
        for name in order:
            res = run(args.lab, args.a if name == "A" else args.b, args)
            runs[name].append(res)
            print(f"round {r + 1} {name}: {res['per_second']:.0f} tx/s, "
                  f"CPU {res['cpu_ms']:.3f} ms/tx, p99 {res['p99_ms']:.1f} ms, "
                  f"RSS {res['rss_mb']:.1f} MB", flush=True)
    print(f"{args.workload} on {args.backend}, {args.clients} clients, "
          f"{args.rounds} rounds of {args.duration} s (medians):")
    for name, path in (("A", args.a), ("B", args.b)):
        m = {k: statistics.median(x[k] for x in runs[name]) for k in runs[name][0]}
        print(f"  {name} {path}: {m['per_second']:.0f} tx/s, CPU {m['cpu_ms']:.3f} ms/tx, "
              f"p99 {m['p99_ms']:.1f} ms, RSS {m['rss_mb']:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
