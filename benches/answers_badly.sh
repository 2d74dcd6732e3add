#!/usr/bin/env bash
# benches/answers_badly.sh - backends that answer badly (issue 49's bars): retries on a status,
# the retry budget, and outlier ejection, measured through one pinlb worker on core 0 with
# `pinlb bench` on core 1.
#
#   retry      three backends, one answering 503 (`pinlb backend --status 503`): N GETs
#              through a listener whose upstream has retry.on = ["error", "timeout", "http_503"]
#              (bar: 0 non-2xx); the same N as POSTs, no non_idempotent (bar: the 503s come back,
#              about a third)
#   budget     three backends all answering 503: N GETs; the backends' requests over the
#              clients' (pinlb_backend_requests_total; bar: at most 1.25) and the latency
#   ejection   two good backends and one answering 500 to every other request (a Python
#              backend, never two 500s in a row), at RATE req/s for DURATION (`--rate`), with
#              [upstream.NAME.outlier] success_rate = 0.8, interval 1s, base_time BASE: /status
#              polled every 100 ms for each backend's state and ejections; the time to the first
#              ejection (bar: within 2 s), each ejection's length (bar: the second longer than the
#              first), and the most backends out at once (bar: at most max_ejected's one of three)
#
# Usage: bash benches/answers_badly.sh [PINLB_BINARY]   (default target/release/pinlb)
#   N=10000, CONNS=16, RATE=1000, DURATION=12s, BASE=2s, PORT_BASE=18330, KEEP_TMP=1,
#   OUT_MD=/tmp/pinlb-answers-badly.md
# Needs: python3, curl, taskset.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLB=${1:-$ROOT/target/release/pinlb}
N=${N:-10000}
CONNS=${CONNS:-16}
RATE=${RATE:-1000}
DURATION=${DURATION:-12s}
BASE=${BASE:-2s}
KEEP_TMP=${KEEP_TMP:-0}
OUT_MD=${OUT_MD:-/tmp/pinlb-answers-badly.md}
WORK=$(mktemp -d)
PIDS=()
log() { printf '[answers-badly] %s\n' "$*" >&2; }
die() { printf '[answers-badly] ERROR: %s\n' "$*" >&2; exit 1; }
PORT_BASE=${PORT_BASE:-18330}
NEXT_PORT=$PORT_BASE
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
running_pids() { echo "${PIDS[@]}"; }
install_cleanup
require python3 curl taskset
[[ -x $PINLB ]] || die "no pinlb binary at $PINLB (cargo build --release, or pass its path)"

# Thirteen free ports, picked in this shell (pick_port counts on from the last).
for name in OK1 OK2 BAD A503 B503 C503 FLAKY GOOD1 GOOD2 RETRY BUDGET EJECT ADMIN; do
    pick_port
    printf -v "$name" '%s' "$PICKED"
done

# The backends, on core 1: pinlb's test backends, and the Python one that fails every other
# answer.
taskset -c 1 "$PINLB" backend --listen "127.0.0.1:$OK1" --listen "127.0.0.1:$OK2" \
    --listen "127.0.0.1:$GOOD1" --listen "127.0.0.1:$GOOD2" --cpus 1 >"$WORK/ok.log" 2>&1 &
PIDS+=($!)
taskset -c 1 "$PINLB" backend --status 503 --listen "127.0.0.1:$BAD" --listen "127.0.0.1:$A503" \
    --listen "127.0.0.1:$B503" --listen "127.0.0.1:$C503" --cpus 1 >"$WORK/bad.log" 2>&1 &
PIDS+=($!)
cat >"$WORK/flaky.py" <<'PY'
import asyncio, sys
n = 0
async def serve(r, w):
    global n
    try:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            if head.startswith(b"GET /health"):
                status = 200
            else:
                n += 1
                status = 500 if n % 2 else 200
            w.write(b"HTTP/1.1 %d X\r\ncontent-length: 11\r\n\r\nhello world" % status)
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        w.close()
async def main():
    s = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]), backlog=1024)
    async with s:
        await s.serve_forever()
asyncio.run(main())
PY
taskset -c 1 python3 "$WORK/flaky.py" "$FLAKY" >"$WORK/flaky.log" 2>&1 &
PIDS+=($!)

cat >"$WORK/pinlb.toml" <<EOF
[runtime]
cpus = [0]

[admin]
address = "127.0.0.1:$ADMIN"

[[listener]]
address = "127.0.0.1:$RETRY"
upstream = "retry"

[[listener]]
address = "127.0.0.1:$BUDGET"
upstream = "budget"

[[listener]]
address = "127.0.0.1:$EJECT"
upstream = "eject"

[upstream.retry]
backends = [{ address = "127.0.0.1:$OK1" }, { address = "127.0.0.1:$OK2" }, { address = "127.0.0.1:$BAD" }]
retry = { on = ["error", "timeout", "http_503"] }

[upstream.budget]
backends = [{ address = "127.0.0.1:$A503" }, { address = "127.0.0.1:$B503" }, { address = "127.0.0.1:$C503" }]
retry = { on = ["error", "timeout", "http_503"] }

[upstream.eject]
backends = [{ address = "127.0.0.1:$GOOD1" }, { address = "127.0.0.1:$GOOD2" }, { address = "127.0.0.1:$FLAKY" }]

[upstream.eject.outlier]
consecutive_5xx = 5
success_rate = 0.8
interval = "1s"
base_time = "$BASE"
max_ejected = 0.34
EOF
"$PINLB" check -c "$WORK/pinlb.toml" >"$WORK/check.log" 2>&1 || die "pinlb check: $(cat "$WORK/check.log")"
RUST_LOG=warn taskset -c 0 "$PINLB" serve -c "$WORK/pinlb.toml" >"$WORK/pinlb.log" 2>&1 &
PINLB_PID=$!
PIDS+=("$PINLB_PID")
for p in "$RETRY" "$BUDGET" "$EJECT"; do
    for ((i = 0; i < 50; i++)); do
        curl -s -o /dev/null "http://127.0.0.1:$p/" && break
        sleep 0.1
    done
done

# bench NAME URL ARGS...: pinlb bench on core 1, its JSON report in $WORK/NAME.json.
bench() {
    local name=$1 url=$2
    shift 2
    taskset -c 1 "$PINLB" bench --no-checks --cpus 1 -c "$CONNS" "$@" --json "$WORK/$name.json" \
        "$url" >"$WORK/$name.out" 2>&1 || die "pinlb bench $name: $(tail -5 "$WORK/$name.out")"
}
# backend_requests UPSTREAM: the requests pinlb sent to the upstream's backends, retries included.
backend_requests() {
    curl -s "http://127.0.0.1:$ADMIN/metrics" |
        awk -v u="upstream=\"$1\"" 'index($0, "pinlb_backend_requests_total{") == 1 && index($0, u) { n += $2 } END { print n + 0 }'
}
# summary NAME: "responses non_2xx statuses p50_ms p99_ms" from a bench JSON report.
summary() {
    python3 - "$WORK/$1.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r["targets"][0]
req = t["requests"]
codes = req["statuses"]["codes"]
lat = t["latency"]
print(req["responses"], req["errors"]["non_2xx"],
      ",".join(f"{k}x{v}" for k, v in sorted(codes.items())) or "-",
      round(lat["p50_us"] / 1000, 3), round(lat["p99_us"] / 1000, 3))
PY
}

log "retry: $N GETs, one backend of three answering 503"
bench retry_get "http://127.0.0.1:$RETRY/" -n "$N"
log "retry: $N POSTs, no non_idempotent"
bench retry_post "http://127.0.0.1:$RETRY/" -n "$N" -m POST --body 'x=1'
log "budget: $N GETs, every backend answering 503"
before=$(backend_requests budget)
bench budget "http://127.0.0.1:$BUDGET/" -n "$N"
after=$(backend_requests budget)

log "ejection: $RATE req/s for $DURATION, one backend failing every other answer"
: >"$WORK/states.tsv"
bench ejection "http://127.0.0.1:$EJECT/" --rate "$RATE" -d "$DURATION" --warmup 0s --rounds 1 &
load=$!
start=$(date +%s.%N)
while kill -0 "$load" 2>/dev/null; do
    now=$(date +%s.%N)
    curl -s "http://127.0.0.1:$ADMIN/status" | python3 -c '
import json, sys
s = json.load(sys.stdin)
for u in s["upstreams"]:
    if u["name"] == "eject":
        out = [b for b in u["backends"] if b["state"] in ("ejected", "skipped")]
        flaky = [b for b in u["backends"] if b["address"].endswith(":" + sys.argv[2])][0]
        print("%.3f\t%d\t%s\t%d" % (float(sys.argv[1]), len(out), flaky["state"], flaky["ejections"]))
' "$(awk -v a="$now" -v b="$start" 'BEGIN { print a - b }')" "$FLAKY" >>"$WORK/states.tsv" || true
    sleep 0.1
done
wait "$load" || die "the ejection run failed"

MD="$WORK/report.md"
{
    echo "## Backends that answer badly: retries on a status, the budget, ejection"
    echo
    echo "One pinlb worker on core 0; backends and \`pinlb bench -c $CONNS\` on core 1."
    echo
    echo "| case | responses | non-2xx | statuses | p50 ms | p99 ms |"
    echo "|---|---:|---:|---|---:|---:|"
    for c in retry_get retry_post budget; do
        read -r n bad codes p50 p99 <<<"$(summary "$c")"
        echo "| $c | $n | $bad | $codes | $p50 | $p99 |"
    done
    echo
    awk -v a="$before" -v b="$after" -v n="$N" 'BEGIN { printf "budget: the backends got %d requests for %d of the clients'"'"': %.3f× (bar: at most 1.25×)\n", b - a, n, (b - a) / n }'
    echo
    python3 - "$WORK/states.tsv" "$BASE" <<'PY'
import sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
rows = [(float(t), int(out), st, int(e.strip())) for t, out, st, e in rows]
first = next((t for t, _, st, _ in rows if st == "ejected"), None)
spans, since = [], None
for t, _, st, _ in rows:
    if st == "ejected" and since is None:
        since = t
    elif st != "ejected" and since is not None:
        spans.append(t - since)
        since = None
most = max((out for _, out, _, _ in rows), default=0)
ej = max((e for *_, e in rows), default=0)
print(f"ejection (base_time {sys.argv[2]}): first ejected {first if first is None else round(first, 2)} s into the load (bar: within 2 s); "
      f"ejections {ej}; lengths seen {', '.join('%.1f s' % s for s in spans) or '-'} (each longer than the last); "
      f"most backends out at once {most} of 3 (bar: at most 1)")
PY
    echo
    echo "Per case, pinlb bench's output is in the kept temp dir (KEEP_TMP=1)."
} >"$MD"
publish_report "$MD"
