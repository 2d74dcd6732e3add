#!/usr/bin/env bash
# benches/ab.sh - does `pinlb bench` with ab's flags measure what ab measures? Both send the
# same requests to one nginx `return 200` backend in interleaved rounds, from the same core,
# and their req/s are compared (the bar: within 10%).
#
# Topology (meant for a 2-core machine):
#   core 0: the backend: nginx, worker_processes 1, `return 200 "hello world\n"`, access_log
#           off (benches/peers/backend-nginx.conf, rendered into a mktemp -d dir)
#   core 1: the load generator under test, one at a time, each for $REQUESTS requests:
#     MODE=close (ab's default: a new connection per request, HTTP/1.0)
#           taskset -c 1 ab -q -n $REQUESTS -c $CONNS URL
#           pinlb bench -n $REQUESTS -c $CONNS --disable-keepalive --http1.0 -t 1 --cpus 1 URL
#     MODE=keepalive (ab -k)
#           taskset -c 1 ab -q -k -n $REQUESTS -c $CONNS URL
#           pinlb bench -n $REQUESTS -c $CONNS --http1.0 -t 1 --cpus 1 URL
#     MODE=post (a POST with a 64-byte body, new connection per request)
#           taskset -c 1 ab -q -n $REQUESTS -c $CONNS -p BODY -T application/json URL
#           pinlb bench -n $REQUESTS -c $CONNS --disable-keepalive --http1.0 -m POST
#                --body-file BODY -H "Content-Type: application/json" -t 1 --cpus 1 URL
#   Both tools send HTTP/1.0, as ab does, so nginx frames and closes alike for both.
#
# Procedure: the backend is started once and polled (curl, bounded loop) until it answers.
# Then for each of $ROUNDS rounds: ab, then pinlb bench, so runs interleave and drift of the
# machine hits both alike. Neither gets a warm-up.
#
# Measured per round and tool:
#   req/s       ab's "Requests per second"; pinlb bench's requests_per_sec (JSON)
#   failed      ab's "Failed requests" + "Non-2xx responses"; pinlb bench's errors (JSON)
#   CPU us/req  the tool's own utime+stime (bash `times` around the run), divided by the
#               requests it sent
#   core busy   % busy of cores 0 and 1 during the run (/proc/stat)
# Summary: per tool the median over rounds, and pinlb bench / ab for req/s as a ratio of
# medians and paired per round (the median of per-round ratios). Markdown, also in $OUT_MD.
#
# Usage:
#   bash benches/ab.sh
#   MODE=post ROUNDS=3 bash benches/ab.sh
# Environment:
#   MODE=close          close | keepalive | post (above)
#   ROUNDS=5            rounds (one ab run and one pinlb bench run each)
#   REQUESTS=10000      requests per run (-n)
#   CONNS=10            concurrency (-c)
#   PINLB=target/release/pinlb    pinlb binary (relative to the repo root)
#   OUT_MD=/tmp/pinlb-ab.md       where the Markdown report is written
#   PORT_BASE=18280     the backend gets the first free loopback port >= this
#   KEEP_TMP=0          1 = keep the temp dir (config, logs, raw outputs)
# Needs: nginx, ab (Debian apache2-utils; installed with apt-get if missing and root), curl,
# taskset, ss, awk.
#
# Don't run it while something else is busy on the machine: both cores are part of the
# measurement. Both are sampled for 1 s before anything starts, with a warning when busy.

set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_DIR="$ROOT/benches/peers"
CMDLINE="bash $0${*:+ $*}"

MODE=${MODE:-close}
ROUNDS=${ROUNDS:-5}
REQUESTS=${REQUESTS:-10000}
CONNS=${CONNS:-10}
PINLB=${PINLB:-target/release/pinlb}
OUT_MD=${OUT_MD:-/tmp/pinlb-ab.md}
PORT_BASE=${PORT_BASE:-18280}
KEEP_TMP=${KEEP_TMP:-0}

case $PINLB in /*) ;; *) PINLB="$ROOT/$PINLB" ;; esac
PATH="$PATH:/usr/sbin:/sbin"

log() { printf '[ab] %s\n' "$*" >&2; }
die() {
    printf '[ab] ERROR: %s\n' "$*" >&2
    exit 1
}

[[ $MODE =~ ^(close|keepalive|post)$ ]] || die "MODE must be close, keepalive or post (got '$MODE')"
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer (got '$ROUNDS')"
[[ $REQUESTS =~ ^[1-9][0-9]*$ ]] || die "REQUESTS must be a positive integer (got '$REQUESTS')"
[[ $CONNS =~ ^[1-9][0-9]*$ ]] || die "CONNS must be a positive integer (got '$CONNS')"

# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
install_missing "nginx-light apache2-utils" nginx ab
require nginx ab curl taskset ss awk sort
[[ -x $PINLB ]] || die "pinlb binary not found at $PINLB (build it: cargo build --release, or set PINLB=...)"
"$PINLB" bench --help 2>/dev/null | grep -q -- --disable-keepalive ||
    die "'$PINLB bench' has no --disable-keepalive: build a newer pinlb"
(($(nproc) >= 2)) || die "need at least 2 cores (0 and 1); nproc=$(nproc)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/pinlb-ab.XXXXXX")
chmod 755 "$WORK" # nginx workers may run as an unprivileged user when root
BACKEND_PID=""
GEN_PID=""
running_pids() { echo "$GEN_PID" "$BACKEND_PID"; }
install_cleanup

# The request each mode sends, as each tool's flags.
BODY="$WORK/body.json"
printf '{"id":12345,"name":"pinlb","tags":["a","b","c"],"ok":true,"n":42}\n' >"$BODY"
case $MODE in
close)
    AB_FLAGS=()
    PINLB_FLAGS=(--disable-keepalive --http1.0)
    ;;
keepalive)
    AB_FLAGS=(-k)
    PINLB_FLAGS=(--http1.0)
    ;;
post)
    AB_FLAGS=(-p "$BODY" -T application/json)
    PINLB_FLAGS=(--disable-keepalive --http1.0 -m POST --body-file "$BODY" -H "Content-Type: application/json")
    ;;
esac

# run_tool TOOL OUTFILE: runs ab or pinlb bench on core 1, waits for it; sets RUN_CPU_S.
run_tool() {
    case $1 in
    ab) run_timed "$2" taskset -c 1 ab -q -n "$REQUESTS" -c "$CONNS" "${AB_FLAGS[@]}" "$URL" ;;
    pinlb)
        run_timed "$2.txt" "$PINLB" bench -n "$REQUESTS" -c "$CONNS" -t 1 --cpus 1 \
            "${PINLB_FLAGS[@]}" --json "$2" "$URL"
        ;;
    esac
}

read -r IDLE_BUSY0 IDLE_BUSY1 < <(core_busy_1s)
pick_port
PORT=$PICKED
URL="http://127.0.0.1:$PORT/"

mkdir -p "$WORK/backend"
nginx_temp_paths "$WORK/backend"
sed -e "s|@DIR@|$WORK/backend|g" -e "s|@BACKEND_PORT@|$PORT|g" \
    "$PEERS_DIR/backend-nginx.conf" >"$WORK/backend/nginx.conf"
taskset -c 0 nginx -p "$WORK/backend" -c "$WORK/backend/nginx.conf" -e "$WORK/backend/error.log" \
    >"$WORK/backend/stdout.log" 2>&1 &
BACKEND_PID=$!
wait_ready backend "$PORT" "$BACKEND_PID" "$WORK/backend/error.log"

host_facts
AB_VERSION=$(ab -V 2>&1 | awk 'NR == 1 {print $5}' || true)
PINLB_VERSION=$("$PINLB" --version 2>&1 | awk 'NR == 1 {print $NF}')
NGINX_VERSION=$(nginx -v 2>&1 | awk -F'/' '{print $2}')

echo "== pinlb bench vs ab ($MODE) =="
echo "command:   MODE=$MODE ROUNDS=$ROUNDS REQUESTS=$REQUESTS CONNS=$CONNS PINLB=$PINLB $CMDLINE"
echo "nproc:     $(nproc) ($CPU_MODEL); commit $COMMIT; before start: core0 ${IDLE_BUSY0}% busy, core1 ${IDLE_BUSY1}% busy"
echo "topology:  nginx $NGINX_VERSION backend $URL -> core 0; ab $AB_VERSION / pinlb bench $PINLB_VERSION, $CONNS concurrent, 1 thread -> core 1"
echo "ab:        ab -q -n $REQUESTS -c $CONNS ${AB_FLAGS[*]} URL"
echo "pinlb:     pinlb bench -n $REQUESTS -c $CONNS -t 1 --cpus 1 ${PINLB_FLAGS[*]} URL"
if ((IDLE_BUSY0 > 10 || IDLE_BUSY1 > 10)); then
    log "WARNING: cores busy before start (core0 ${IDLE_BUSY0}%, core1 ${IDLE_BUSY1}%) - something else is running; numbers will be noisy"
fi

RAW="$WORK/raw.tsv" # round tool rps failed requests cpu_us_per_req core0% core1%
: >"$RAW"
for ((r = 1; r <= ROUNDS; r++)); do
    for tool in ab pinlb; do
        kill -0 "$BACKEND_PID" 2>/dev/null || die "the backend died"
        out="$WORK/$tool-$r.out"
        j0=$(core_jiffies)
        run_tool "$tool" "$out"
        read -r busy0 busy1 < <(core_busy "$j0" "$(core_jiffies)")
        if [[ $tool == ab ]]; then
            rps=$(awk '/^Requests per second:/ {print $4}' "$out")
            reqs=$(awk '/^Complete requests:/ {print $3}' "$out")
            failed=$(awk '/^Failed requests:/ {f = $3} /^Non-2xx responses:/ {n = $3} END {print f + n}' "$out")
        else
            rps=$(json_first median "$out")
            reqs=$(json_first sent "$out")
            failed=0
            for k in connect timeout read non_2xx; do
                n=$(json_first "$k" "$out")
                failed=$((failed + ${n:-0}))
            done
        fi
        [[ -n $rps && -n $reqs ]] || {
            cat "$out" "$out.txt" >&2 2>/dev/null || true
            die "could not parse $tool's output ($out)"
        }
        cpu_us=$(awk -v c="$RUN_CPU_S" -v n="$reqs" 'BEGIN { printf "%.1f\n", (n > 0) ? c * 1e6 / n : 0 }')
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$tool" "$rps" "$failed" "$reqs" "$cpu_us" "$busy0" "$busy1" >>"$RAW"
        log "round $r $tool: $rps req/s, $failed failed of $reqs, ${cpu_us} us CPU/req, core0 ${busy0}% core1 ${busy1}%"
    done
done

# Per-round ratio pinlb/ab, then its median.
paired=$(awk -F'\t' '$2 == "ab" {a[$1] = $3} $2 == "pinlb" {p[$1] = $3}
    END { for (r in a) if (a[r] > 0 && (r in p)) print p[r] / a[r] }' "$RAW" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) { print "nan"; exit }
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.3f\n", m }')
read -r ab_rps ab_min ab_max < <(stats ab 3)
read -r pl_rps pl_min pl_max < <(stats pinlb 3)
read -r ab_cpu _ _ < <(stats ab 6)
read -r pl_cpu _ _ < <(stats pinlb 6)
read -r ab_failed _ _ < <(stats ab 4)
read -r pl_failed _ _ < <(stats pinlb 4)
ratio=$(awk -v p="$pl_rps" -v a="$ab_rps" 'BEGIN { printf "%.3f\n", (a > 0) ? p / a : 0 }')
verdict=$(awk -v r="$paired" 'BEGIN { print (r >= 0.9 && r <= 1.1) ? "within 10%" : "NOT within 10%" }')

MD="$WORK/report.md"
{
    echo "### pinlb bench vs ab, MODE=$MODE ($ROUNDS rounds, -n $REQUESTS -c $CONNS)"
    echo
    echo "| tool | req/s median | min | max | failed (median) | CPU µs/req |"
    echo "|---|---:|---:|---:|---:|---:|"
    printf '| ab %s | %.0f | %.0f | %.0f | %s | %s |\n' "$AB_VERSION" "$ab_rps" "$ab_min" "$ab_max" "$ab_failed" "$ab_cpu"
    printf '| pinlb bench %s | %.0f | %.0f | %.0f | %s | %s |\n' "$PINLB_VERSION" "$pl_rps" "$pl_min" "$pl_max" "$pl_failed" "$pl_cpu"
    echo
    echo "pinlb bench / ab req/s: $ratio (ratio of medians), $paired (paired per round): $verdict"
    raw_section "Per round (round, tool, req/s, failed, requests, CPU µs/req, core0 %, core1 %):"
} >"$MD"
publish_report "$MD"
