#!/usr/bin/env bash
# Side-by-side benchmark of idem against dtmrs 0.13.0 on the embedded default database
# (SQLite for both): the same participant (one nginx answering SUCCESS), the same load
# (wrk, 2-step sagas with wait_result), rounds alternating the order of the two servers,
# each server fresh in each run. See bench/peer/README.md. Not part of CI.
#
#   bench/peer/dtmrs.sh [--rounds 3] [--duration 15] [--warmup 3] [--out DIR] ...
#   bench/peer/dtmrs.sh --help
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

DTMRS_VERSION=0.13.0
rounds=3
duration=15
warmup=3
threads=2
connections=32
out="$root/target/peer/results"
dtmrs_root="$root/target/peer/dtmrs"
idem_bin="$root/target/release/idem"
drain_timeout=60
fsync_probe=auto
keep=0
idem_args=()
dtmrs_env=()

usage() {
  cat <<EOF
Usage: bench/peer/dtmrs.sh [options]

Runs idem and dtmrs $DTMRS_VERSION side by side on SQLite, alternating A/B, and prints per
run and median figures; writes them as JSON into --out.

  --rounds N          rounds, each runs both servers, the order alternating (default $rounds)
  --duration S        measured seconds per run (default $duration)
  --warmup S          warm-up seconds per run, not counted (default $warmup)
  --connections N     wrk connections (default $connections)
  --threads N         wrk threads (default $threads)
  --out DIR           where the JSON results go (default target/peer/results)
  --dtmrs-root DIR    cargo install root of dtmrs, reused when present
                      (default target/peer/dtmrs)
  --idem-bin PATH     the idem binary (default target/release/idem; built with
                      'cargo build --release -p idem' when missing)
  --idem-arg ARG      one more argument for 'idem serve' (repeatable), e.g.
                      --idem-arg=--sqlite-full-sync=false; none by default
  --dtmrs-env NAME=VALUE
                      one more environment variable for dtmrs (repeatable), e.g.
                      --dtmrs-env RUST_LOG=warn; none by default
  --drain-timeout S   how long to wait after the window for sagas still running (default
                      $drain_timeout)
  --no-fsync-probe    skip the short strace probe that counts fsyncs per saga
  --keep              keep the temporary directory (logs, databases) and print its path
  -h, --help          this text
EOF
}

while (($#)); do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --connections) connections="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --dtmrs-root) dtmrs_root="$2"; shift 2 ;;
    --idem-bin) idem_bin="$2"; shift 2 ;;
    --idem-arg) idem_args+=("$2"); shift 2 ;;
    --idem-arg=*) idem_args+=("${1#--idem-arg=}"); shift ;;
    --dtmrs-env) dtmrs_env+=("$2"); shift 2 ;;
    --dtmrs-env=*) dtmrs_env+=("${1#--dtmrs-env=}"); shift ;;
    --drain-timeout) drain_timeout="$2"; shift 2 ;;
    --no-fsync-probe) fsync_probe=0; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
  esac
done
for n in "$rounds" "$duration" "$warmup" "$connections" "$threads" "$drain_timeout"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "not a whole number: $n" >&2; exit 2; }
done
((rounds >= 1 && duration >= 1 && connections >= threads && threads >= 1)) \
  || { echo "need rounds >= 1, duration >= 1, connections >= threads >= 1" >&2; exit 2; }

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---- what it needs ---------------------------------------------------------------------

apt_install() {
  [[ $EUID -eq 0 ]] || die "$* missing: run as root, or install them (apt-get install $*)"
  log "installing $* from Debian's packages"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
  fi
}

ensure_tools() {
  local missing=()
  command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx-light)
  command -v wrk >/dev/null || missing+=(wrk)
  command -v curl >/dev/null || missing+=(curl)
  ((${#missing[@]} == 0)) || apt_install "${missing[@]}"
  command -v python3 >/dev/null || die "python3 is needed (standard library only)"
  if [[ $fsync_probe == auto ]]; then
    if command -v strace >/dev/null; then fsync_probe=1; else
      log "strace not found: no fsync probe (apt-get install strace to have it)"
      fsync_probe=0
    fi
  fi
}

nginx_bin() { command -v nginx || echo /usr/sbin/nginx; }

ensure_dtmrs() {
  dtmrs_bin="$dtmrs_root/bin/dtmrs"
  if [[ -x $dtmrs_bin ]] && grep -q "\"dtmrs $DTMRS_VERSION " "$dtmrs_root/.crates.toml" 2>/dev/null; then
    return
  fi
  command -v cargo >/dev/null || die "cargo is needed to install dtmrs"
  log "installing dtmrs $DTMRS_VERSION into $dtmrs_root (a few minutes, once)"
  cargo install --locked --force --root "$dtmrs_root" dtmrs --version "$DTMRS_VERSION"
}

ensure_idem() {
  if [[ ! -x $idem_bin ]]; then
    [[ $idem_bin == "$root/target/release/idem" ]] || die "no idem binary at $idem_bin"
    log "building idem (cargo build --release -p idem)"
    (cd "$root" && cargo build --release -p idem)
  fi
}

# ---- processes, cleaned up on any exit ---------------------------------------------------

work=""
nginx_pid=""
server_pid=""
aux_pid=""

stop_pid() { # pid [seconds before SIGKILL]
  local pid="$1" wait_s="${2:-10}" i
  [[ -n $pid ]] || return 0
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < wait_s * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_pid "$aux_pid" 2
  stop_pid "$server_pid" 5
  stop_pid "$nginx_pid" 5
  if [[ -n $work && -d $work ]]; then
    if ((keep)); then log "kept $work"; else rm -rf "$work"; fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- measurements ------------------------------------------------------------------------

clk_tck="$(getconf CLK_TCK)"

cpu_ticks() { # utime + stime of a process, all its threads, in clock ticks
  local stat f
  stat="$(<"/proc/$1/stat")"
  read -r -a f <<<"${stat##*) }"
  echo $((f[11] + f[12]))
}

machine_busy() { # ticks of all CPUs not idle (nor waiting for I/O) since boot
  local user nice sys irq softirq steal
  read -r _ user nice sys _ _ irq softirq steal _ </proc/stat
  echo $((user + nice + sys + irq + softirq + steal))
}

# The nginx master and its workers together.
nginx_ticks() {
  local total pid pids=()
  total="$(cpu_ticks "$nginx_pid")"
  read -r -a pids <<<"$(cat "/proc/$nginx_pid/task/"*/children 2>/dev/null | tr '\n' ' ')"
  for pid in "${pids[@]}"; do
    [[ -r /proc/$pid/stat ]] && total=$((total + $(cpu_ticks "$pid")))
  done
  echo "$total"
}

status_kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }

now() { date +%s.%N; }

# Files under the run's directory that the server holds open (the database, its WAL).
open_files() {
  local fd t files=()
  for fd in "/proc/$1/fd/"*; do
    t="$(readlink "$fd" 2>/dev/null)" || continue
    [[ $t == "$2"/* ]] && files+=("${t#"$2"/}")
  done
  ((${#files[@]})) || return 0
  printf '%s\n' "${files[@]}" | sort -u | paste -sd, -
}

wait_ready() { # pid url log
  local i
  for ((i = 0; i < 300; i++)); do
    kill -0 "$1" 2>/dev/null || { tail -20 "$3" >&2; die "server exited at start"; }
    curl -fsS -o /dev/null --max-time 1 "$2" 2>/dev/null && return 0
    sleep 0.1
  done
  tail -20 "$3" >&2
  die "server not answering at $2 after 30 s"
}

start_nginx() {
  local dir="$work/nginx" user=""
  mkdir -p "$dir/tmp/body"
  [[ $EUID -eq 0 ]] && user="user root;"
  sed -e "s#@PREFIX@#$dir#g" -e "s#@PORT@#$nginx_port#g" -e "s#@USER@#$user#" \
    "$here/nginx.conf.in" >"$dir/nginx.conf"
  "$(nginx_bin)" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" >"$dir/stdout.log" 2>&1 &
  nginx_pid=$!
  local i
  for ((i = 0; i < 100; i++)); do
    kill -0 "$nginx_pid" 2>/dev/null || { cat "$dir/error.log" "$dir/stdout.log" >&2; die "nginx exited"; }
    curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$nginx_port/ping" 2>/dev/null && break
    sleep 0.1
  done
  access_log="$dir/access.log"
  touch "$access_log"
}

# One server, fresh, in its own directory: sets server_pid, server_url, db_path.
start_server() { # server dir
  local server="$1" dir="$2"
  local port gport
  read -r port gport <<<"$(python3 "$here/peer.py" ports 2)"
  server_url="http://127.0.0.1:$port"
  if [[ $server == idem ]]; then
    db_path="$dir/idem.db"
    # Only idem's own flags: no IDEM_* or RUST_LOG from the caller's environment.
    (cd "$dir" && exec env -i PATH="$PATH" HOME="$dir" "$idem_bin" serve \
      --database-url "sqlite://$db_path?mode=rwc" --listen "127.0.0.1:$port" --node bench \
      "${idem_args[@]}") >"$dir/server.log" 2>&1 &
    server_pid=$!
    wait_ready "$server_pid" "$server_url/api/ping" "$dir/server.log"
  else
    db_path="$dir/dtmrs.db"
    # Only the three variables (and --dtmrs-env's): its defaults for everything else, no
    # RUST_LOG from the caller either.
    (cd "$dir" && exec env -i PATH="$PATH" HOME="$dir" DTMRS_DB="sqlite:$db_path" \
      DTMRS_ADDR="127.0.0.1:$port" DTMRS_GRPC_ADDR="127.0.0.1:$gport" \
      "${dtmrs_env[@]}" "$dtmrs_bin") >"$dir/server.log" 2>&1 &
    server_pid=$!
    wait_ready "$server_pid" "$server_url/health" "$dir/server.log"
  fi
}

# wrk runs in the background and the script waits for it, so that a signal to the script
# is handled at once (bash runs a trap only after a foreground command ends).
start_wrk() { # seconds participant-url run-tag output-file
  wrk -t "$threads" -c "$connections" -d "${1}s" --timeout 30s -s "$here/saga.lua" \
    "$server_url" -- "$2" "$3" >"$4" 2>&1 &
  aux_pid=$!
}

finish_wrk() { # output-file
  local rc=0
  wait "$aux_pid" || rc=$?
  aux_pid=""
  ((rc == 0)) || { cat "$1" >&2; die "wrk failed ($rc)"; }
}

run_wrk() { start_wrk "$@"; finish_wrk "$4"; }

# One measured run of one server: writes $runs_dir/<tag>.json.
run_one() { # server round position
  local server="$1" round="$2" position="$3"
  local tag="r$round-$server" dir="$work/r$round-$server"
  local env="$dir/run.env" participant
  mkdir -p "$dir"
  participant="http://127.0.0.1:$nginx_port/p/$tag"
  log "round $round: $server, fresh in $dir"
  start_server "$server" "$dir"
  {
    echo "server=$server"
    echo "round=$round"
    echo "position=$position"
    echo "tag=$tag"
    echo "clk_tck=$clk_tck"
    echo "access_log=$access_log"
    echo "db_path=$db_path"
    echo "pid=$server_pid"
  } >"$env"

  if ((fsync_probe)); then
    # Load for 3 s; for 2 of them count the server's fsync and fdatasync calls (strace
    # slows the server down while attached, so this is before the warm-up).
    local probe_t0 probe_t1
    start_wrk 3 "$participant" "$tag-probe" "$dir/probe.out"
    sleep 0.5
    probe_t0="$(now)"
    timeout -s INT 2 strace -f -c -e trace=fsync,fdatasync -o "$dir/strace.txt" \
      -p "$server_pid" >/dev/null 2>&1 || true
    probe_t1="$(now)"
    finish_wrk "$dir/probe.out"
    {
      echo "probe_out=$dir/probe.out"
      echo "probe_t0=$probe_t0"
      echo "probe_t1=$probe_t1"
      echo "fsync_calls=$(python3 "$here/peer.py" fsyncs "$dir/strace.txt")"
    } >>"$env"
  fi

  if ((warmup > 0)); then
    run_wrk "$warmup" "$participant" "$tag-warm" "$dir/warm.out"
    echo "warm_out=$dir/warm.out" >>"$env"
  else
    echo "warm_out=" >>"$env"
  fi

  local t0 t1 t2 cpu0 cpu1 ng0 ng1 mb0 mb1
  cpu0="$(cpu_ticks "$server_pid")"
  ng0="$(nginx_ticks)"
  mb0="$(machine_busy)"
  t0="$(now)"
  run_wrk "$duration" "$participant" "$tag-run" "$dir/wrk.out"
  t1="$(now)"
  cpu1="$(cpu_ticks "$server_pid")"
  ng1="$(nginx_ticks)"
  mb1="$(machine_busy)"
  {
    echo "wrk_out=$dir/wrk.out"
    echo "t0=$t0"
    echo "t1=$t1"
    echo "cpu0=$cpu0"
    echo "cpu1=$cpu1"
    echo "nginx_cpu0=$ng0"
    echo "nginx_cpu1=$ng1"
    echo "mach_busy0=$mb0"
    echo "mach_busy1=$mb1"
    echo "hwm1=$(status_kb "$server_pid" VmHWM)"
    echo "open_files=$(open_files "$server_pid" "$dir")"
  } >>"$env"

  # Sagas the server accepted but has not finished yet (dtmrs answers a submit before
  # running the saga): wait until the participant has seen them all, or nothing moves for
  # 5 s, or --drain-timeout.
  local accepted done_n last=-1 still=0 drained=0 deadline
  accepted="$(python3 - "$dir" <<'EOF'
import json, sys, os
total = 0
for name in ("probe.out", "warm.out", "wrk.out"):
    p = os.path.join(sys.argv[1], name)
    if os.path.exists(p):
        for line in open(p, errors="replace"):
            if line.startswith("WRK_JSON "):
                w = json.loads(line[9:])
                total += max(0, w["requests"] - w["non2xx"])
print(total)
EOF
)"
  deadline=$(($(date +%s) + drain_timeout))
  while :; do
    done_n="$(python3 "$here/peer.py" count "$access_log" "$tag")"
    if ((done_n >= accepted && done_n == last)); then drained=1; break; fi
    if ((done_n == last)); then still=$((still + 1)); else still=0; fi
    ((still < 10)) || break
    (($(date +%s) < deadline)) || break
    last="$done_n"
    sleep 0.5
  done
  t2="$(now)"
  {
    echo "t2=$t2"
    echo "drained=$drained"
    echo "cpu2=$(cpu_ticks "$server_pid")"
    echo "hwm2=$(status_kb "$server_pid" VmHWM)"
    echo "rss2=$(status_kb "$server_pid" VmRSS)"
    echo "threads2=$(status_kb "$server_pid" Threads)"
  } >>"$env"

  stop_pid "$server_pid" 15
  server_pid=""
  echo "log_bytes=$(stat -c %s "$dir/server.log")" >>"$env"
  python3 "$here/peer.py" record "$env" "$runs_dir/$tag.json"
  # Keep the figures, drop the database and logs unless --keep.
  ((keep)) || rm -rf "$dir"
}

# ---- main ------------------------------------------------------------------------------

ensure_tools
ensure_dtmrs
ensure_idem

work="$(mktemp -d "${TMPDIR:-/tmp}/idem-peer.XXXXXX")"
runs_dir="$work/runs"
mkdir -p "$runs_dir" "$out"
read -r nginx_port <<<"$(python3 "$here/peer.py" ports 1)"
start_nginx

meta="$work/meta.env"
{
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "idem_version=$("$idem_bin" --version)"
  echo "idem_bin_mtime=$(date -u -r "$idem_bin" +%Y-%m-%dT%H:%M:%SZ)"
  echo "idem_commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "idem_worktree_dirty=$(git -C "$root" status --porcelain 2>/dev/null | grep -qv '^??' && echo yes || echo no)"
  echo "idem_args=${idem_args[*]}"
  echo "idem_sqlite_full_sync=$(env -i PATH="$PATH" "$idem_bin" config "${idem_args[@]}" 2>/dev/null \
    | awk -F' *= *' '$1 == "sqlite_full_sync" { print $2 }' | sed 's/ *#.*//')"
  echo "dtmrs_version=$DTMRS_VERSION"
  echo "dtmrs_bin=$dtmrs_bin"
  echo "dtmrs_env=${dtmrs_env[*]}"
  echo "nginx_version=$("$(nginx_bin)" -v 2>&1 | sed 's#.*/##')"
  echo "wrk_version=$(wrk -v 2>&1 | head -1 | awk '{print $2}')"
  echo "kernel=$(uname -r)"
  echo "cpus=$(nproc)"
  echo "cpu_model=$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"
  echo "rounds=$rounds"
  echo "duration_s=$duration"
  echo "warmup_s=$warmup"
  echo "connections=$connections"
  echo "threads=$threads"
  echo "fsync_probe=$fsync_probe"
} >"$meta"
log "idem: $idem_bin ${idem_args[*]}; dtmrs $DTMRS_VERSION: ${dtmrs_env[*]} $dtmrs_bin"
log "participant: nginx on 127.0.0.1:$nginx_port"
log "$rounds round(s) of ${duration} s (+${warmup} s warm-up), wrk -t $threads -c $connections"

for ((round = 1; round <= rounds; round++)); do
  if ((round % 2)); then order=(idem dtmrs); else order=(dtmrs idem); fi
  run_one "${order[0]}" "$round" 1
  sleep 1
  run_one "${order[1]}" "$round" 2
  sleep 1
done

stamp="$(date -u +%Y%m%dT%H%M%SZ)"
python3 "$here/peer.py" summary "$meta" "$out/dtmrs-$stamp.json" "$runs_dir"/*.json
