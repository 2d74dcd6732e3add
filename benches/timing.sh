#!/usr/bin/env bash
# benches/timing.sh - does pinlb's timing breakdown tell the truth? (issue 29's first bar)
#
# A `pinlb backend --delay 20ms` (it waits 20 ms, without CPU, before each response head) on
# core 1, pinlb on core 0 with the JSON access log and `server_timing = true`, and REQUESTS
# sequential requests from curl on one keep-alive connection. Prints, over the requests, the
# median, p99 and maximum of the log's `upstream_header_time` (must be 20-22 ms), of its
# `proxy_us` (pinlb's own share, must be under 1 ms), and how many responses' Server-Timing
# differs from their log line (must be 0); and, for scale, the backend's own time to first
# byte measured by curl directly against it (its 20 ms sleep is tokio's, rounded up to the
# millisecond timer, so it answers in 20-21 ms itself).
#
# Usage: bash benches/timing.sh [PINLB_BINARY]   (default target/release/pinlb)
#   REQUESTS=200 (default), KEEP_TMP=1 keeps the temp dir, PORT_BASE=18190 (the first free
#   loopback ports from here on)
# Needs: curl, taskset, python3.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLB=${1:-$ROOT/target/release/pinlb}
REQUESTS=${REQUESTS:-200}
KEEP_TMP=${KEEP_TMP:-0}
WORK=$(mktemp -d)
PIDS=()
log() { printf '[timing] %s\n' "$*" >&2; }
die() { printf '[timing] ERROR: %s\n' "$*" >&2; exit 1; }
PORT_BASE=${PORT_BASE:-18190}
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
running_pids() { echo "${PIDS[@]}"; }
install_cleanup

pick_port
BACKEND_PORT=$PICKED
pick_port
PORT=$PICKED

taskset -c 1 "$PINLB" backend --listen "127.0.0.1:$BACKEND_PORT" --cpus 1 --delay 20ms \
    >"$WORK/backend.log" 2>&1 &
PIDS+=($!)
wait_ready backend "$BACKEND_PORT" "$!" "$WORK/backend.log"

cat >"$WORK/pinlb.toml" <<EOF
[runtime]
cpus = [0]
[[listener]]
address = "127.0.0.1:$PORT"
upstream = "app"
server_timing = true
[upstream.app]
backends = [{ address = "127.0.0.1:$BACKEND_PORT" }]
[log]
access = "$WORK/access.log"
format = "json"
EOF
"$PINLB" serve -c "$WORK/pinlb.toml" 2>"$WORK/pinlb.log" &
PINLB_PID=$!
PIDS+=("$PINLB_PID")
wait_ready pinlb "$PORT" "$PINLB_PID" "$WORK/pinlb.log"
# The probe above is a line of its own; the measured ones follow it.
sleep 0.3
: >"$WORK/access.log"

# One curl, one connection, REQUESTS requests: each response's Server-Timing header, in order.
urls=()
for _ in $(seq "$REQUESTS"); do urls+=(-o /dev/null "http://127.0.0.1:$PORT/"); done
taskset -c 1 curl -s -D - "${urls[@]}" | tr -d '\r' |
    awk -F': ' 'tolower($1) == "server-timing" {print $2}' >"$WORK/server-timing.txt"
kill -TERM "$PINLB_PID"
wait "$PINLB_PID" 2>/dev/null || true
# The backend alone, the same requests: curl's time to the first response byte.
direct=()
for _ in $(seq "$REQUESTS"); do direct+=(-o /dev/null "http://127.0.0.1:$BACKEND_PORT/"); done
taskset -c 1 curl -s -w '%{time_starttransfer}\n' "${direct[@]}" >"$WORK/direct.txt"

python3 - "$WORK/access.log" "$WORK/server-timing.txt" "$WORK/direct.txt" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
timings = [l.strip() for l in open(sys.argv[2]) if l.strip()]
assert len(lines) == len(timings), (len(lines), len(timings))
def st(v, name):
    for m in v.split(","):
        m = m.strip()
        if m.startswith(name + ";dur="):
            return float(m.split("=", 1)[1])
header = [l["upstream_header_time"] * 1000 for l in lines]
proxy = [l["proxy_us"] for l in lines]
differ = sum(
    1 for l, t in zip(lines, timings)
    if round(st(t, "pinlb") * 1000) != l["proxy_us"]
    # connect_us + header_us: two figures each cut to whole microseconds.
    or abs(round(st(t, "upstream") * 1000) - (l["connect_us"] + l["header_us"])) > 1
)
direct = [float(l) * 1000 for l in open(sys.argv[3]) if l.strip()]
def p99(v):
    return sorted(v)[max(0, round(len(v) * 0.99) - 1)]
def row(name, v, f):
    print(f"{name:<34}median {f(statistics.median(v))}  p99 {f(p99(v))}  max {f(max(v))}")
print(f"requests:                         {len(lines)}")
row("upstream_header_time (ms):", header, lambda x: f"{x:.3f}")
row("proxy_us:", proxy, lambda x: f"{x:.0f}")
row("backend direct, first byte (ms):", direct, lambda x: f"{x:.3f}")
print(f"Server-Timing != log:             {differ}")
PY
