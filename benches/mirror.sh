#!/usr/bin/env bash
# benches/mirror.sh - what mirroring costs the main path (issue 49's mirroring bars).
#
# One pinlb worker on core 0 with four listeners in front of the same two backends (`pinlb
# backend`, core 1), `pinlb bench -n N -c CONNS` on core 1:
#   none    no mirror
#   fast    mirror = { upstream = "fast", share = 0.1 }: a canary that answers at once; the
#           copies it got (pinlb_backend_requests_total) against N / 10 (bar: 2,000 ± 150 of
#           20,000)
#   slow    mirror = { upstream = "slow", share = 0.1 }: a canary that answers after 2 s
#   dead    mirror = { upstream = "dead", share = 0.1 }: a socket that accepts and never answers
# ROUNDS interleaved rounds (none, fast, slow, dead, ...): each listener's p50 and p99 (median
# over the rounds) against none's (bar: p99 within 10%), the copies dropped past max_in_flight
# (pinlb_upstream_side_requests_dropped_total), and pinlb's RSS after each run (bar: bounded).
#
# Usage: bash benches/mirror.sh [PINLB_BINARY]   (default target/release/pinlb)
#   N=20000, CONNS=16, ROUNDS=3, PORT_BASE=18330, KEEP_TMP=1, OUT_MD=/tmp/pinlb-mirror.md
# Needs: python3, curl, taskset.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLB=${1:-$ROOT/target/release/pinlb}
N=${N:-20000}
CONNS=${CONNS:-16}
ROUNDS=${ROUNDS:-3}
KEEP_TMP=${KEEP_TMP:-0}
OUT_MD=${OUT_MD:-/tmp/pinlb-mirror.md}
WORK=$(mktemp -d)
PIDS=()
log() { printf '[mirror] %s\n' "$*" >&2; }
die() { printf '[mirror] ERROR: %s\n' "$*" >&2; exit 1; }
PORT_BASE=${PORT_BASE:-18330}
NEXT_PORT=$PORT_BASE
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
running_pids() { echo "${PIDS[@]}"; }
install_cleanup
require python3 curl taskset
[[ -x $PINLB ]] || die "no pinlb binary at $PINLB (cargo build --release, or pass its path)"

for name in APP1 APP2 FAST SLOW DEAD NONE_L FAST_L SLOW_L DEAD_L ADMIN; do
    pick_port
    printf -v "$name" '%s' "$PICKED"
done
taskset -c 1 "$PINLB" backend --listen "127.0.0.1:$APP1" --listen "127.0.0.1:$APP2" \
    --listen "127.0.0.1:$FAST" --cpus 1 >"$WORK/app.log" 2>&1 &
PIDS+=($!)
taskset -c 1 "$PINLB" backend --delay 2s --listen "127.0.0.1:$SLOW" --cpus 1 >"$WORK/slow.log" 2>&1 &
PIDS+=($!)
# Accepts (the kernel's backlog does) and never reads nor answers.
taskset -c 1 python3 -c '
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(4096)
time.sleep(100000)
' "$DEAD" >"$WORK/dead.log" 2>&1 &
PIDS+=($!)

{
    printf '[runtime]\ncpus = [0]\n\n[admin]\naddress = "127.0.0.1:%s"\n\n' "$ADMIN"
    printf '[[listener]]\naddress = "127.0.0.1:%s"\nupstream = "app"\n\n' "$NONE_L"
    for m in fast slow dead; do
        var=${m^^}_L
        printf '[[listener]]\naddress = "127.0.0.1:%s"\nupstream = "app"\n' "${!var}"
        printf 'mirror = { upstream = "%s", share = 0.1 }\n\n' "$m"
    done
    printf '[upstream.app]\nbackends = [{ address = "127.0.0.1:%s" }, { address = "127.0.0.1:%s" }]\n\n' "$APP1" "$APP2"
    printf '[upstream.fast]\nbackends = [{ address = "127.0.0.1:%s" }]\n\n' "$FAST"
    printf '[upstream.slow]\nbackends = [{ address = "127.0.0.1:%s" }]\n\n' "$SLOW"
    printf '[upstream.dead]\nbackends = [{ address = "127.0.0.1:%s" }]\n' "$DEAD"
} >"$WORK/pinlb.toml"
"$PINLB" check -c "$WORK/pinlb.toml" >"$WORK/check.log" 2>&1 || die "pinlb check: $(cat "$WORK/check.log")"
RUST_LOG=warn taskset -c 0 "$PINLB" serve -c "$WORK/pinlb.toml" >"$WORK/pinlb.log" 2>&1 &
PINLB_PID=$!
PIDS+=("$PINLB_PID")
for p in "$NONE_L" "$FAST_L" "$SLOW_L" "$DEAD_L"; do
    for ((i = 0; i < 50; i++)); do
        curl -s -o /dev/null "http://127.0.0.1:$p/" && break
        sleep 0.1
    done
done

metric() { # NAME LABEL: the sum of a /metrics family's series that carry LABEL
    curl -s "http://127.0.0.1:$ADMIN/metrics" |
        awk -v n="$1" -v l="$2" 'index($0, n "{") == 1 && index($0, l) { s += $2 } END { print s + 0 }'
}

RAW="$WORK/raw.tsv"
: >"$RAW"
fast_before=$(metric pinlb_backend_requests_total 'upstream="fast"')
for ((r = 1; r <= ROUNDS; r++)); do
    for m in none fast slow dead; do
        var=${m^^}_L
        taskset -c 1 "$PINLB" bench --no-checks --cpus 1 -c "$CONNS" -n "$N" --json "$WORK/$m.$r.json" \
            "http://127.0.0.1:${!var}/" >"$WORK/$m.$r.out" 2>&1 || die "pinlb bench $m: $(tail -3 "$WORK/$m.$r.out")"
        rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$PINLB_PID/status")
        python3 - "$WORK/$m.$r.json" "$r" "$m" "$rss" >>"$RAW" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["targets"][0]
lat, req = t["latency"], t["requests"]
print("\t".join([sys.argv[2], sys.argv[3], str(lat["p50_us"]), str(lat["p99_us"]),
                 str(req["errors"]["non_2xx"]), sys.argv[4]]))
PY
        log "round $r $m: $(tail -1 "$RAW")"
    done
    if ((r == 1)); then
        fast_copies=$(($(metric pinlb_backend_requests_total 'upstream="fast"') - fast_before))
    fi
done
dropped_slow=$(metric pinlb_upstream_side_requests_dropped_total 'upstream="slow"')
dropped_dead=$(metric pinlb_upstream_side_requests_dropped_total 'upstream="dead"')

MD="$WORK/report.md"
{
    echo "## Mirroring a tenth of the requests: the main path's latency beside no mirror"
    echo
    echo "$ROUNDS interleaved rounds of \`pinlb bench -n $N -c $CONNS\` (core 1); one pinlb worker on core 0."
    echo
    echo "| listener | p50 µs (median) | p99 µs (median) | p99 ÷ none's | non-2xx | RSS KiB after its last run |"
    echo "|---|---:|---:|---:|---:|---:|"
    python3 - "$RAW" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
def med(m, i):
    return statistics.median(float(r[i]) for r in rows if r[1] == m)
base = med("none", 3)
for m in ("none", "fast", "slow", "dead"):
    last = [r for r in rows if r[1] == m][-1]
    bad = sum(int(r[4]) for r in rows if r[1] == m)
    print(f"| {m} | {med(m, 2):.0f} | {med(m, 3):.0f} | {med(m, 3) / base:.3f} | {bad} | {last[5].strip()} |")
PY
    echo
    echo "Copies the fast canary got in round 1: $fast_copies of $N requests (bar: $((N / 10)) ± 150)."
    echo "Copies dropped past max_in_flight (64): slow canary $dropped_slow, dead one $dropped_dead."
    raw_section "Per run (round, listener, p50 µs, p99 µs, non-2xx, pinlb RSS KiB):"
} >"$MD"
publish_report "$MD"
