#!/usr/bin/env bash
# Runs the benchmark matrix of docs/performance.md and writes one JSON file per run into
# the directory given (default: bench/results). Build first: cargo build --release.
# Takes about 35 minutes on 2 cores. Every run uses fresh databases; each timed workload
# runs 3 rounds alternating idem and its limit script, and reports the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/results}"
mkdir -p "$out"
lab=./target/release/idem-lab
for backend in postgres sqlite mysql; do
  for workload in tcc saga empty; do
    echo "== $workload on $backend"
    $lab bench --workload "$workload" --backend "$backend" --clients 32 --duration 10 --warmup 3 \
      --rounds 3 --count 300 --limit --json "$out/$workload-$backend.json"
  done
done
for n in 1 2 3; do
  # Several coordinators sharing one PostgreSQL, the 32 clients spread over them.
  echo "== empty on postgres, $n coordinators"
  $lab bench --workload empty --backend postgres --clients 32 --duration 10 --warmup 3 \
    --rounds 3 --count 0 --coordinators "$n" --json "$out/empty-postgres-coordinators-$n.json"
done
for backend in sqlite postgres; do
  # A participant slow enough (30 s a call) that all 100,000 are in flight at once; the
  # coordinator drives at most --max-driving of them and keeps the rest in its backlog.
  echo "== inflight on $backend"
  $lab bench --workload inflight --backend "$backend" --clients 64 --inflight 100000 \
    --participant-delay-ms 30000 --json "$out/inflight-$backend.json"
  echo "== recovery on $backend"
  $lab bench --workload recovery --backend "$backend" --clients 64 --inflight 100000 \
    --json "$out/recovery-$backend.json"
done
