#!/usr/bin/env python3
"""The Markdown tables of docs/performance.md from a directory of bench/run-all.sh results.

    bench/table.py docs/bench/run-4

Timed workloads: the median of the rounds for each figure (each round's share of the limit
was measured beside its own limit run; the median of those shares is shown). Inflight and
recovery: their one run.
"""

import json
import os
import statistics
import sys


def rounds(path):
    with open(path) as f:
        data = json.load(f)
    return data if isinstance(data, list) else [data]


def med(rs, f):
    vals = [f(r) for r in rs if f(r) is not None]
    return statistics.median(vals) if vals else None


def timed(d):
    print("| workload | database | global tx/s | p50 / p99 ms | statements per tx (coordinator + participants) "
          "| coordinator CPU ms per tx | peak RSS MB | limit tx/s | idem / limit (per round) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for backend in ("postgres", "mysql", "sqlite"):
        for workload in ("tcc", "saga", "empty"):
            path = os.path.join(d, f"{workload}-{backend}.json")
            if not os.path.exists(path):
                continue
            rs = rounds(path)
            sql = rs[0].get("sql") or {}
            shares = [r["share_of_limit"] for r in rs if r.get("share_of_limit") is not None]
            print(f"| {workload} | {'mariadb' if backend == 'mysql' else backend} "
                  f"| {med(rs, lambda r: r['per_second']):,.0f} "
                  f"| {med(rs, lambda r: r['p50_ms']):.1f} / {med(rs, lambda r: r['p99_ms']):.1f} "
                  f"| {sql.get('statements', 0):.0f} ({sql.get('coordinator_statements', 0):.0f} + "
                  f"{sql.get('participant_statements', 0):.0f}) "
                  f"| {med(rs, lambda r: 1000 * r['coordinator_cpu_seconds'] / max(r['transactions'], 1)):.3f} "
                  f"| {med(rs, lambda r: r['coordinator_peak_rss_mb']):.1f} "
                  f"| {med(rs, lambda r: r.get('limit_per_second')) or 0:,.0f} "
                  f"| **{100 * statistics.median(shares):.0f} %** ({', '.join(f'{100 * s:.0f}' for s in shares)}) |"
                  if shares else "| — | — |")


def coordinators(d):
    print("\n| coordinators | global tx/s | coordinator CPU ms per tx (all of them) | p99 ms | largest peak RSS MB |")
    print("|---|---|---|---|---|")
    for n in (1, 2, 3):
        path = os.path.join(d, f"empty-postgres-coordinators-{n}.json")
        if not os.path.exists(path):
            continue
        rs = rounds(path)
        print(f"| {n} | {med(rs, lambda r: r['per_second']):,.0f} "
              f"| {med(rs, lambda r: 1000 * r['coordinator_cpu_seconds'] / max(r['transactions'], 1)):.3f} "
              f"| {med(rs, lambda r: r['p99_ms']):.1f} | {med(rs, lambda r: r['coordinator_peak_rss_mb']):.1f} |")


def scale(d):
    for name in ("inflight", "recovery"):
        for backend in ("sqlite", "postgres"):
            path = os.path.join(d, f"{name}-{backend}.json")
            if os.path.exists(path):
                r = rounds(path)[0]
                keep = {k: v for k, v in r.items() if k not in ("phases", "sql")}
                print(f"\n{name} {backend}: {json.dumps(keep)}")


if __name__ == "__main__":
    d = sys.argv[1] if len(sys.argv) > 1 else "bench/results"
    timed(d)
    coordinators(d)
    scale(d)
