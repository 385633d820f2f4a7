#!/usr/bin/env bash
# Runs the benchmark matrix of docs/performance.md and writes one JSON file per run into
# the directory given (default: bench/results). Build first: cargo build --release.
# Takes about 25 minutes on 2 cores. Every run uses fresh databases.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/results}"
mkdir -p "$out"
lab=./target/release/idem-lab
for backend in postgres sqlite mysql; do
  for workload in tcc saga empty; do
    echo "== $workload on $backend"
    $lab bench --workload "$workload" --backend "$backend" --clients 32 --duration 20 --warmup 3 \
      --count 300 --limit --json "$out/$workload-$backend.json" | tail -n +1
  done
done
for backend in postgres sqlite; do
  # A participant slow enough (10 s a call) that all 10,000 are in flight at once.
  echo "== inflight on $backend"
  $lab bench --workload inflight --backend "$backend" --clients 64 --inflight 10000 \
    --participant-delay-ms 10000 --json "$out/inflight-$backend.json"
  echo "== recovery on $backend"
  $lab bench --workload recovery --backend "$backend" --clients 64 --inflight 10000 \
    --json "$out/recovery-$backend.json"
done
