#!/usr/bin/env bash
# benches/rate_limit.sh - does a rate limit hold exactly across workers without slowing the
# clients under it? (issue 31's rate-limit bar)
#
# pinlb with 2 workers (cores 0 and 1) in front of `pinlb backend` (core 2 when there is one),
# a zone keyed by the header X-Client at LIMIT r/s with a burst of 50 ms of it (nodelay). Two `pinlb bench` open-loop
# clients run at once for DURATION, each with its own key and many connections (spread by the
# kernel over both workers):
#   hot   at 10 x LIMIT: must get LIMIT req/s accepted (200), within 2%; the rest 429;
#   cool  at LIMIT / 2: must get every request accepted, its latency beside the same client's
#         in a run on a listener without the limit.
# Prints each client's accepted req/s, the ratio to the limit, the 429s, and the cool client's
# p50/p99 with and without the limit.
#
# Usage: bash benches/rate_limit.sh [PINLB_BINARY]   (default target/release/pinlb)
#   LIMIT=1000 (r/s), BURST=LIMIT/20, DURATION=10s, CONNS=32 (per client), KEEP_TMP=1 keeps the temp dir,
#   PORT_BASE=18290
# Needs: python3, taskset, curl.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLB=${1:-$ROOT/target/release/pinlb}
LIMIT=${LIMIT:-1000}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-32}
# 50 ms of the rate: an open-loop client's sends are not evenly spaced, and with no burst at all a
# request a little early is refused and one a little late loses its lateness (nginx's too).
BURST=${BURST:-$((LIMIT / 20))}
KEEP_TMP=${KEEP_TMP:-0}
WORK=$(mktemp -d)
PIDS=()
log() { printf '[rate_limit] %s\n' "$*" >&2; }
die() { printf '[rate_limit] ERROR: %s\n' "$*" >&2; exit 1; }
PORT_BASE=${PORT_BASE:-18290}
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
running_pids() { echo "${PIDS[@]}"; }
install_cleanup
require python3 taskset curl

CORES=$(nproc)
BACKEND_CORE=$((CORES > 2 ? 2 : 1))
LOAD_CORES=$((CORES > 3 ? 3 : BACKEND_CORE))

pick_port
BACKEND_PORT=$PICKED
pick_port
LIMITED=$PICKED
pick_port
PLAIN=$PICKED

taskset -c "$BACKEND_CORE" "$PINLB" backend --listen "127.0.0.1:$BACKEND_PORT" \
    --cpus "$BACKEND_CORE" >"$WORK/backend.log" 2>&1 &
PIDS+=($!)
wait_ready backend "$BACKEND_PORT" "$!" "$WORK/backend.log"

cat >"$WORK/pinlb.toml" <<EOF
[runtime]
cpus = [0, 1]

[limit.client]
key = "header:x-client"
rate = "${LIMIT}r/s"

[[listener]]
address = "127.0.0.1:$LIMITED"
upstream = "app"
rate_limit = [{ zone = "client", burst = $BURST, nodelay = true }]

[[listener]]
address = "127.0.0.1:$PLAIN"
upstream = "app"

[upstream.app]
backends = [{ address = "127.0.0.1:$BACKEND_PORT" }]
EOF
"$PINLB" serve -c "$WORK/pinlb.toml" 2>"$WORK/pinlb.log" &
PINLB_PID=$!
PIDS+=("$PINLB_PID")
wait_ready pinlb "$PLAIN" "$PINLB_PID" "$WORK/pinlb.log"
wait_ready pinlb "$LIMITED" "$PINLB_PID" "$WORK/pinlb.log"

# bench NAME PORT RATE KEY: one open-loop client, its report in $WORK/NAME.json.
bench() {
    "$PINLB" bench "$1=http://127.0.0.1:$2/" -H "X-Client: $4" --rate "$3" -c "$CONNS" \
        -d "$DURATION" --warmup 0s --rounds 1 --cpus "$LOAD_CORES" --no-checks \
        --json "$WORK/$1.json" >"$WORK/$1.out" 2>&1
}

# The cool client alone on the plain listener first: its latency without any limit. The
# window is new for the limited runs anyway (a different key each time).
log "cool client on the plain listener: $((LIMIT / 2)) req/s for $DURATION"
bench baseline "$PLAIN" $((LIMIT / 2)) base
log "hot ($((LIMIT * 10)) req/s) and cool ($((LIMIT / 2)) req/s) clients on the limited listener at once"
bench hot "$LIMITED" $((LIMIT * 10)) hot &
HOT=$!
bench cool "$LIMITED" $((LIMIT / 2)) cool || die "cool client failed: $(cat "$WORK/cool.out")"
wait "$HOT" || die "hot client failed: $(cat "$WORK/hot.out")"

python3 - "$WORK" "$LIMIT" "$DURATION" "$BURST" <<'PY'
import json, re, sys
work, limit, duration, burst = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
secs = float(re.sub(r"s$", "", duration))

def target(name):
    return json.load(open(f"{work}/{name}.json"))["targets"][0]

def codes(name):
    c = target(name)["requests"]["statuses"]["codes"]
    return int(c.get("200", 0)), int(c.get("429", 0))

def ms(name):
    l = target(name)["latency"]
    return f"{l['p50_us'] / 1000:.2f}/{l['p99_us'] / 1000:.2f}"

# The most a key can get in the window: the rate, plus the burst (and the first request) at once.
most = limit * secs + burst + 1
print()
print(f"limit {limit} r/s, burst {burst}, {secs:g} s: at most {most:.0f} requests per key")
print()
print("| client | offered req/s | accepted | accepted req/s | ÷ most | 429s | p50/p99 ms |")
print("|---|---:|---:|---:|---:|---:|---|")
for name, offered in [("hot", limit * 10), ("cool", limit // 2), ("baseline", limit // 2)]:
    ok, refused = codes(name)
    print(f"| {name} | {offered} | {ok} | {ok / secs:.1f} | {ok / most:.3f} | {refused} | {ms(name)} |")
ok, _ = codes("hot")
r = ok / most
print()
print(f"hot client: {r:.3f} x the limit ({'within' if abs(r - 1) <= 0.02 else 'OUTSIDE'} ±2%)")
_, refused = codes("cool")
print(f"cool client: {refused} refused ({'none, as required' if refused == 0 else 'SOME REFUSED'}); latency {ms('cool')} ms p50/p99 beside {ms('baseline')} without the limit (baseline row)")
PY
