#!/usr/bin/env python3
"""Helper of bench/peer/dtmrs.sh (Python 3, standard library only).

Subcommands:
  ports N                      print N free loopback TCP ports
  count LOG TAG                print how many sagas of run TAG the participant completed
  fsyncs FILE                  print the fsync + fdatasync calls in an `strace -c` summary
  record RUN.env RUN.json      turn one run's raw figures into its JSON record, print a line
  summary META.env OUT RUN.json...
                               print the tables and medians, write all of it to OUT (JSON)

A saga counts as completed at the participant when nginx answered the POST to its step-2
action (`/p/<tag>/s2/action`) with 2xx; the access log line's time is when the answer was
sent.
"""

import json
import os
import re
import socket
import sqlite3
import statistics
import sys

LINE = re.compile(r"^(\d+\.\d+) (\S+) /p/([^/ ]+)/s(\d+)/(action|compensate) (\d{3})$")


def ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    print(" ".join(str(s.getsockname()[1]) for s in socks))
    for s in socks:
        s.close()


def read_log(path, tag):
    """(time, step, op) of each 2xx POST of run `tag`."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LINE.match(line.rstrip("\n"))
            if not m or m.group(3) != tag or m.group(2) != "POST":
                continue
            if not m.group(6).startswith("2"):
                continue
            out.append((float(m.group(1)), int(m.group(4)), m.group(5)))
    return out


def count(path, tag):
    print(sum(1 for _, step, op in read_log(path, tag) if step == 2 and op == "action"))


def fsyncs(path):
    total = 0
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                # % time, seconds, usecs/call, calls, [errors,] syscall
                if parts and parts[-1] in ("fsync", "fdatasync"):
                    total += int(parts[3])
    except FileNotFoundError:
        pass
    print(total)


def read_env(path):
    env = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if "=" in line:
                k, v = line.split("=", 1)
                env[k] = v
    return env


def wrk_json(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("WRK_JSON "):
                    return json.loads(line[len("WRK_JSON "):])
    except FileNotFoundError:
        pass
    return None


def db_check(server, path):
    """What the database file says after the server stopped: journal mode, rows by
    status, file sizes."""
    info = {"path": path, "exists": os.path.exists(path)}
    if not info["exists"]:
        return info
    info["bytes"] = os.path.getsize(path)
    table = "idem_global" if server == "idem" else "trans_global"
    try:
        con = sqlite3.connect(path, timeout=10)
        info["journal_mode"] = con.execute("PRAGMA journal_mode").fetchone()[0]
        info["rows_by_status"] = dict(
            con.execute(f"SELECT status, count(*) FROM {table} GROUP BY status").fetchall()
        )
        con.close()
    except sqlite3.Error as e:
        info["error"] = str(e)
    return info


def num(env, key, default=None):
    v = env.get(key, "")
    if v == "":
        return default
    return float(v)


def record(env_path, out_path):
    env = read_env(env_path)
    server, tag = env["server"], env["tag"]
    t0, t1, t2 = num(env, "t0"), num(env, "t1"), num(env, "t2")
    tck = num(env, "clk_tck")
    calls = read_log(env["access_log"], tag)

    def completed(lo, hi):
        return sum(1 for t, s, op in calls if s == 2 and op == "action" and lo < t <= hi)

    window = t1 - t0
    done_window = completed(t0, t1)
    done_drain = completed(t0, t2)
    done_until_t1 = completed(0, t1)
    done_total = completed(0, float("inf"))
    compensations = sum(1 for _, _, op in calls if op == "compensate")
    step1_total = sum(1 for _, s, op in calls if s == 1 and op == "action")

    meas = wrk_json(env["wrk_out"]) or {}
    warm = wrk_json(env["warm_out"]) or {}
    probe = wrk_json(env.get("probe_out", "")) or {}

    def ok(w):
        return max(0, w.get("requests", 0) - w.get("non2xx", 0))

    accepted = ok(probe) + ok(warm) + ok(meas)
    cpu_window = (num(env, "cpu1") - num(env, "cpu0")) / tck
    cpu_drain = (num(env, "cpu2") - num(env, "cpu0")) / tck
    busy = (num(env, "mach_busy1") - num(env, "mach_busy0")) / tck
    nginx_cpu = (num(env, "nginx_cpu1") - num(env, "nginx_cpu0")) / tck
    lat = meas.get("latency_us", {})

    fsync_calls = num(env, "fsync_calls")
    probe_done = None
    if env.get("probe_t0") and env.get("probe_t1"):
        probe_done = completed(num(env, "probe_t0"), num(env, "probe_t1"))

    rec = {
        "server": server,
        "round": int(env["round"]),
        "position": int(env["position"]),
        "tag": tag,
        "window_s": round(window, 3),
        "completed": done_window,
        "sagas_per_s": round(done_window / window, 1) if window > 0 else None,
        "wrk": meas,
        "wrk_warmup": warm,
        "wrk_ok_per_s": round(ok(meas) / window, 1) if window > 0 else None,
        "non2xx": meas.get("non2xx"),
        "socket_errors": meas.get("errors"),
        "p50_ms": lat.get("p50", 0) / 1000 if lat else None,
        "p99_ms": lat.get("p99", 0) / 1000 if lat else None,
        "cpu_s": round(cpu_window, 3),
        "cores": round(cpu_window / window, 3) if window > 0 else None,
        "cpu_ms_per_saga": round(1000 * cpu_window / done_window, 4) if done_window else None,
        # The server's CPU from the start of the window until the participant saw no more
        # completions (dtmrs answers a submit before it runs the saga, so it may still be
        # working when wrk stops), over the completions in that time.
        "drain_s": round(t2 - t1, 3),
        "drained": env.get("drained") == "1",
        "completed_incl_drain": done_drain,
        "cpu_ms_per_saga_incl_drain": (
            round(1000 * cpu_drain / done_drain, 4) if done_drain else None
        ),
        "submits_accepted": accepted,
        "backlog_at_window_end": accepted - done_until_t1,
        "completed_total": done_total,
        "step1_total": step1_total,
        "compensations_total": compensations,
        "rss_peak_kb": int(num(env, "hwm2", 0)),
        "rss_peak_kb_at_window_end": int(num(env, "hwm1", 0)),
        "rss_kb_end": int(num(env, "rss2", 0)),
        "threads_end": int(num(env, "threads2", 0)),
        "machine_busy_cores": round(busy / window, 3) if window > 0 else None,
        "nginx_cores": round(nginx_cpu / window, 3) if window > 0 else None,
        "fsync_probe": (
            None
            if fsync_calls is None
            else {
                "fsync_calls": int(fsync_calls),
                "completed": probe_done,
                "per_saga": round(fsync_calls / probe_done, 3) if probe_done else None,
            }
        ),
        "open_files": [f for f in env.get("open_files", "").split(",") if f],
        "db": db_check(server, env["db_path"]),
        "log_bytes": int(num(env, "log_bytes", 0)),
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(rec, f, indent=2, sort_keys=True)
    print(
        f"  round {rec['round']} {server:6}: {rec['sagas_per_s']} sagas/s at the participant"
        f" ({rec['wrk_ok_per_s']} 2xx submits/s), cpu {rec['cpu_ms_per_saga']} ms/saga,"
        f" p99 {rec['p99_ms']} ms, rss peak {rec['rss_peak_kb'] / 1024:.1f} MB,"
        f" backlog {rec['backlog_at_window_end']}, drain {rec['drain_s']} s"
    )


def fmt(v, spec):
    if v is None:
        return "-"
    return format(v, spec)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a, b):
    return a / b if a is not None and b else None


def summary(meta_path, out_path, run_paths):
    meta = read_env(meta_path)
    runs = []
    for p in run_paths:
        with open(p, encoding="utf-8") as f:
            runs.append(json.load(f))
    runs.sort(key=lambda r: (r["round"], r["position"]))

    cols = [
        ("round", "round", "d", 5),
        ("server", "server", "s", 6),
        ("sagas/s", "sagas_per_s", ".1f", 8),
        ("2xx/s", "wrk_ok_per_s", ".1f", 8),
        ("non2xx", "non2xx", "d", 6),
        ("p50 ms", "p50_ms", ".1f", 7),
        ("p99 ms", "p99_ms", ".1f", 7),
        ("cpu ms/saga", "cpu_ms_per_saga", ".3f", 11),
        ("+drain", "cpu_ms_per_saga_incl_drain", ".3f", 7),
        ("cores", "cores", ".2f", 5),
        ("rss MB", "rss_peak_mb", ".1f", 6),
        ("backlog", "backlog_at_window_end", "d", 7),
        ("drain s", "drain_s", ".1f", 7),
        ("fsync/saga", "fsync_per_saga", ".2f", 10),
        ("busy", "machine_busy_cores", ".2f", 5),
    ]
    for r in runs:
        r["rss_peak_mb"] = r["rss_peak_kb"] / 1024
        r["fsync_per_saga"] = (r.get("fsync_probe") or {}).get("per_saga")
    print()
    print(
        "Per run (sagas/s: step-2 actions answered by nginx in the window; 2xx/s: wrk's"
        " successful submits; busy: cores in use on the whole machine)"
    )
    print("  ".join(f"{h:>{w}}" for h, _, _, w in cols))
    for r in runs:
        print("  ".join(f"{fmt(r.get(k), s):>{w}}" for _, k, s, w in cols))

    servers = ["idem", "dtmrs"]
    keys = [
        "sagas_per_s",
        "wrk_ok_per_s",
        "p50_ms",
        "p99_ms",
        "cpu_ms_per_saga",
        "cpu_ms_per_saga_incl_drain",
        "cores",
        "rss_peak_mb",
        "backlog_at_window_end",
        "drain_s",
        "fsync_per_saga",
        "machine_busy_cores",
    ]
    med = {s: {k: median([r.get(k) for r in runs if r["server"] == s]) for k in keys}
           for s in servers}
    rounds = sorted({r["round"] for r in runs})
    paired = []
    for n in rounds:
        a = next((r for r in runs if r["round"] == n and r["server"] == "idem"), None)
        b = next((r for r in runs if r["round"] == n and r["server"] == "dtmrs"), None)
        if a and b:
            paired.append({
                "round": n,
                "sagas_per_s": ratio(a["sagas_per_s"], b["sagas_per_s"]),
                "cpu_per_saga": ratio(a["cpu_ms_per_saga"], b["cpu_ms_per_saga"]),
                "cpu_per_saga_incl_drain": ratio(
                    a["cpu_ms_per_saga_incl_drain"], b["cpu_ms_per_saga_incl_drain"]
                ),
            })
    ratios = {
        "sagas_per_s": ratio(med["idem"]["sagas_per_s"], med["dtmrs"]["sagas_per_s"]),
        "cpu_per_saga": ratio(med["idem"]["cpu_ms_per_saga"], med["dtmrs"]["cpu_ms_per_saga"]),
        "cpu_per_saga_incl_drain": ratio(
            med["idem"]["cpu_ms_per_saga_incl_drain"], med["dtmrs"]["cpu_ms_per_saga_incl_drain"]
        ),
        "p99": ratio(med["idem"]["p99_ms"], med["dtmrs"]["p99_ms"]),
        "per_round": paired,
        "median_of_round_ratios": {
            k: median([p[k] for p in paired])
            for k in ("sagas_per_s", "cpu_per_saga", "cpu_per_saga_incl_drain")
        },
    }
    targets = {
        "sagas_per_s_ratio_ge_3": (ratios["sagas_per_s"] or 0) >= 3,
        "cpu_per_saga_ratio_le_0_25": (
            ratios["cpu_per_saga"] is not None and ratios["cpu_per_saga"] <= 0.25
        ),
        "idem_rss_peak_le_50_mb": (
            med["idem"]["rss_peak_mb"] is not None and med["idem"]["rss_peak_mb"] <= 50
        ),
    }

    print()
    print(f"Medians over {len(rounds)} round(s)")
    print(f"{'':28}{'idem':>10}{'dtmrs':>10}{'idem/dtmrs':>12}")
    rows = [
        ("completed sagas/s", "sagas_per_s", ".1f"),
        ("2xx submits/s (wrk)", "wrk_ok_per_s", ".1f"),
        ("submit p50 ms", "p50_ms", ".1f"),
        ("submit p99 ms", "p99_ms", ".1f"),
        ("cpu ms/saga (window)", "cpu_ms_per_saga", ".3f"),
        ("cpu ms/saga (incl. drain)", "cpu_ms_per_saga_incl_drain", ".3f"),
        ("server cores", "cores", ".2f"),
        ("peak RSS MB", "rss_peak_mb", ".1f"),
        ("backlog at window end", "backlog_at_window_end", ".0f"),
        ("drain s", "drain_s", ".1f"),
        ("fsync per saga (probe)", "fsync_per_saga", ".2f"),
        ("machine busy cores", "machine_busy_cores", ".2f"),
    ]
    for label, k, s in rows:
        a, b = med["idem"][k], med["dtmrs"][k]
        print(f"{label:28}{fmt(a, s):>10}{fmt(b, s):>10}{fmt(ratio(a, b), '.2f'):>12}")
    mr = ratios["median_of_round_ratios"]
    print()
    print(
        f"idem/dtmrs: sagas/s {fmt(ratios['sagas_per_s'], '.2f')}x (target >= 3),"
        f" cpu per saga {fmt(ratios['cpu_per_saga'], '.2f')}x (target <= 0.25),"
        f" incl. drain {fmt(ratios['cpu_per_saga_incl_drain'], '.2f')}x;"
        f" median of the rounds' own ratios: {fmt(mr['sagas_per_s'], '.2f')}x,"
        f" {fmt(mr['cpu_per_saga'], '.2f')}x"
    )
    print(
        f"peak RSS: idem {fmt(med['idem']['rss_peak_mb'], '.1f')} MB (target <= 50),"
        f" dtmrs {fmt(med['dtmrs']['rss_peak_mb'], '.1f')} MB"
    )
    print("targets met: " + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in targets.items()))

    result = {
        "meta": meta,
        "runs": runs,
        "medians": med,
        "ratios_idem_over_dtmrs": ratios,
        "targets": targets,
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    print(f"results: {out_path}")


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    cmd, args = argv[1], argv[2:]
    if cmd == "ports" and len(args) == 1:
        ports(int(args[0]))
    elif cmd == "count" and len(args) == 2:
        count(*args)
    elif cmd == "fsyncs" and len(args) == 1:
        fsyncs(args[0])
    elif cmd == "record" and len(args) == 2:
        record(*args)
    elif cmd == "summary" and len(args) >= 3:
        summary(args[0], args[1], args[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
