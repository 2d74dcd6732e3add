#!/usr/bin/env bash
# benches/soak_features.sh - pinlb with the features on together, under steady load for
# minutes: does memory stay flat and small, do file descriptors come back, does any request
# fail? (issue 53's soak; `FEATURES=1 bash benches/soak.sh` runs it too.)
#
# Topology (2 cores):
#   core 0: pinlb, one worker: an HTTP/1.1 listener and an h2c one, both with gzip (level 1,
#           application/json), a rate-limit zone every request passes through (its rate and burst are far
#           above the load, h2load's bursts of streams included: the zone's keys and buckets
#           are exercised, nothing is refused), the
#           upstream's response buffering, and a JSON access log written to a file.
#   core 1: the backend, nginx serving a JSON document of DOC_BYTES (benches/peers/json_doc.py)
#           with its Content-Length; wrk (CONNS keep-alive connections, HTTP/1.1, gzip) and
#           h2load (H2_CONNS connections of H2_STREAMS streams each, h2c, gzip) at once.
#
# Procedure: start both; read pinlb's VmRSS and open fds; run the load for DURATION s,
# sampling pinlb's RSS and fds every SAMPLE s; when the load stops, wait until the fd count
# less pinlb's pooled keep-alive connections to the backend is back (bounded, 30 s) and read
# both again. Reported: requests and errors of each client
# (wrk: socket errors and non-2xx; h2load: failed and errored requests, non-2xx), RSS at start,
# after the first 30 s, at the end and its largest, and fds at start and at the end.
# The bars (issue 53): 0 errors; RSS at the end within 10% of its value after 30 s; below 50 MB.
#
# Usage: bash benches/soak_features.sh [PINLB_BINARY]   (default target/release/pinlb)
#   DURATION=180, SAMPLE=10, CONNS=64, H2_CONNS=16, H2_STREAMS=10, DOC_BYTES=3400,
#   OUT_MD=/tmp/pinlb-soak-features.md, KEEP_TMP=1 keeps the temp dir, PORT_BASE=18530
# Needs: nginx, wrk, h2load (nghttp2-client), curl, python3, taskset, ss.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLB=${1:-${PINLB:-$ROOT/target/release/pinlb}}
DURATION=${DURATION:-180}
SAMPLE=${SAMPLE:-10}
CONNS=${CONNS:-64}
H2_CONNS=${H2_CONNS:-16}
H2_STREAMS=${H2_STREAMS:-10}
DOC_BYTES=${DOC_BYTES:-3400}
KEEP_TMP=${KEEP_TMP:-0}
OUT_MD=${OUT_MD:-/tmp/pinlb-soak-features.md}
PORT_BASE=${PORT_BASE:-18530}
WORK=$(mktemp -d)
PIDS=()
WRK_PID=""
log() { printf '[soak-features] %s\n' "$*" >&2; }
die() { printf '[soak-features] ERROR: %s\n' "$*" >&2; exit 1; }
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
running_pids() { echo "${PIDS[@]}" ${WRK_PID:+"$WRK_PID"}; }
install_cleanup
require nginx wrk h2load curl python3 taskset ss
[[ -x $PINLB ]] || die "no pinlb binary at $PINLB (cargo build --release, or pass its path)"

pick_port
BACKEND_PORT=$PICKED
pick_port
H1_PORT=$PICKED
pick_port
H2_PORT=$PICKED
COMPRESS='compress = { algorithms = ["gzip"], gzip_level = 1, types = ["application/json"] }'
cat >"$WORK/pinlb.toml" <<EOF
[runtime]
cpus = [0]

[log]
access = "$WORK/access.log"
format = "json"

[limit.per_client]
rate = "1000000r/s"

[[listener]]
address = "127.0.0.1:$H1_PORT"
upstream = "app"
$COMPRESS
rate_limit = [{ zone = "per_client", burst = 1000, nodelay = true }]

[[listener]]
address = "127.0.0.1:$H2_PORT"
upstream = "app"
h2c = true
$COMPRESS
rate_limit = [{ zone = "per_client", burst = 1000, nodelay = true }]

[upstream.app]
keepalive = 256
backends = [{ address = "127.0.0.1:$BACKEND_PORT" }]

[upstream.app.buffering]
response = true
EOF
"$PINLB" check -c "$WORK/pinlb.toml" >"$WORK/check.log" 2>&1 || die "pinlb check: $(cat "$WORK/check.log")"
start_json_backend "$BACKEND_PORT" "$DOC_BYTES"
RUST_LOG=warn taskset -c 0 "$PINLB" serve -c "$WORK/pinlb.toml" >"$WORK/pinlb.log" 2>&1 &
PID=$!
PIDS+=($PID)
wait_ready pinlb "$H1_PORT" "$PID" "$WORK/pinlb.log"
curl -s --http2-prior-knowledge -H 'Accept-Encoding: gzip' -D "$WORK/h2.head" -o /dev/null \
    "http://127.0.0.1:$H2_PORT/data.json" || die "h2c through pinlb failed"
grep -qi '^content-encoding: gzip' "$WORK/h2.head" || die "no gzip over h2c: $(cat "$WORK/h2.head")"

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
fds() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
# pinlb's idle keep-alive connections to the backend (its pool, up to `keepalive`): open fds
# that are no leak, so the client side's count is the fds less these.
pooled() { ss -tnH state established "( dport = :$BACKEND_PORT )" | wc -l; }
RSS0=$(rss_kib "$PID")
FD0=$(fds "$PID")
log "start: VmRSS $RSS0 KiB, $FD0 fds; load for ${DURATION}s (wrk -c$CONNS, h2load -c$H2_CONNS -m$H2_STREAMS)"

taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" -H 'Accept-Encoding: gzip' \
    "http://127.0.0.1:$H1_PORT/data.json" >"$WORK/wrk.out" 2>&1 &
WRK_PID=$!
taskset -c 1 h2load -t1 -c"$H2_CONNS" -m"$H2_STREAMS" -D "$DURATION" -H 'Accept-Encoding: gzip' \
    "http://127.0.0.1:$H2_PORT/data.json" >"$WORK/h2load.out" 2>&1 &
H2_PID=$!
PIDS+=($H2_PID)
SAMPLES="$WORK/samples.tsv" # seconds rss_kib fds
: >"$SAMPLES"
start=$(date +%s)
# Bounded: DURATION / SAMPLE samples, then the clients end by themselves.
for ((t = SAMPLE; t <= DURATION; t += SAMPLE)); do
    sleep $((start + t - $(date +%s) > 0 ? start + t - $(date +%s) : 0))
    kill -0 "$PID" 2>/dev/null || die "pinlb exited: $(tail -5 "$WORK/pinlb.log")"
    printf '%s\t%s\t%s\n' "$t" "$(rss_kib "$PID")" "$(fds "$PID")" >>"$SAMPLES"
done
wait_wrk "$WORK/wrk.out"
wait "$H2_PID" || die "h2load failed: $(cat "$WORK/h2load.out")"
# The fd count, less the pooled backend connections, settles once the clients' connections
# are closed (bounded: 30 s).
for _ in $(seq 60); do
    (($(fds "$PID") - $(pooled) <= FD0)) && break
    sleep 0.5
done
RSS_END=$(rss_kib "$PID")
FD_END=$(fds "$PID")
POOLED_END=$(pooled)
RSS_30=$(awk -F'\t' '$1 >= 30 { print $2; exit }' "$SAMPLES")
RSS_MAX=$(awk -F'\t' 'BEGIN { m = 0 } $2 > m { m = $2 } END { print m }' "$SAMPLES")

WRK_REQS=$(awk '/requests in/ {print $1}' "$WORK/wrk.out")
WRK_ERRS=$(awk '/Socket errors/ { gsub(",", ""); s = 0; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+$/) s += $i; print s }' "$WORK/wrk.out")
WRK_NON2XX=$(awk '/Non-2xx/ {print $NF}' "$WORK/wrk.out")
H2_LINE=$(grep '^requests:' "$WORK/h2load.out")
H2_DONE=$(awk '{print $8}' <<<"$H2_LINE")
H2_FAILED=$(awk '{print $10}' <<<"$H2_LINE")
H2_ERRORED=$(awk '{print $12}' <<<"$H2_LINE")
H2_STATUS=$(grep '^status codes:' "$WORK/h2load.out")
H2_NON2XX=$(awk '{ gsub(",", ""); print $5 + $7 + $9 }' <<<"$H2_STATUS")
ERRORS=$((${WRK_ERRS:-0} + ${WRK_NON2XX:-0} + H2_FAILED + H2_ERRORED + H2_NON2XX))
LOGGED=$(wc -l <"$WORK/access.log")

MD="$WORK/report.md"
{
    echo "## Soak with the features on: $((DURATION / 60)) min $((DURATION % 60)) s"
    echo
    echo "pinlb $("$PINLB" --version 2>&1 | head -1) on core 0: gzip level 1 on an HTTP/1.1 and an h2c listener, a rate-limit zone, response buffering, a JSON access log. Backend nginx (a ${DOC_BYTES}-byte JSON document) and the clients on core 1: wrk -c$CONNS, h2load -c$H2_CONNS -m$H2_STREAMS."
    echo
    echo "| | value |"
    echo "|---|---:|"
    echo "| wrk requests; socket errors; non-2xx | $WRK_REQS; ${WRK_ERRS:-0}; ${WRK_NON2XX:-0} |"
    echo "| h2load requests done; failed; errored; non-2xx | $H2_DONE; $H2_FAILED; $H2_ERRORED; $H2_NON2XX |"
    echo "| errors, all together (bar: 0) | $ERRORS |"
    echo "| access-log lines | $LOGGED |"
    awk -v a="$RSS0" -v b="$RSS_30" -v c="$RSS_END" -v m="$RSS_MAX" 'BEGIN {
        printf "| RSS MB: start; after 30 s; end; largest | %.1f; %.1f; %.1f; %.1f |\n", a / 1024, b / 1024, c / 1024, m / 1024
        printf "| RSS at the end against after 30 s (bar: within 10%%) | %+.1f%% |\n", (c - b) * 100 / b
        printf "| RSS at the end below 50 MB | %s |\n", (c < 50 * 1024) ? "yes" : "no" }'
    echo "| open fds: start; end (of them pooled backend connections, kept for reuse) | $FD0; $FD_END ($POOLED_END) |"
    echo
    echo "RSS and fds every ${SAMPLE} s (seconds, KiB, fds):"
    echo
    echo '```'
    cat "$SAMPLES"
    echo '```'
} >"$MD"
publish_report "$MD"
