#!/usr/bin/env bash
# benches/callgrind.sh - user-space instructions per proxied request, under valgrind's callgrind.
#
# Instruction counts don't drift with the machine's load the way req/s does, so this is how
# request-path changes are compared on a noisy 2-core machine. It counts pinlb's user space
# only: the kernel's TCP work (about three quarters of the CPU per request) is not in it.
#
# What it does: starts the benchmark backend (nginx `return 200`, benches/peers/backend-nginx.conf)
# on core 1, runs pinlb under callgrind with one worker, warms up with wrk for 2 s, zeroes the
# counters, drives wrk -c16 for 4 s, dumps, and divides the instructions by the requests wrk
# completed.
#
# Usage: bash benches/callgrind.sh [PINLB_BINARY]   (default target/release/pinlb)
#   EXTRA_TOML='...'  appended to pinlb's config, e.g. to count what a feature costs:
#   EXTRA_TOML=$'[admin]\naddress = "127.0.0.1:0"' (metrics on), or
#   EXTRA_TOML=$'[log]\naccess = "/tmp/access.log"' (access log; its thread is counted too:
#   callgrind's totals cover every thread of the process).
#   LISTENER_TOML='...'  added to pinlb's [[listener]] table.
#   FRONT=haproxy  puts HAProxy (one thread, core 1) between wrk and pinlb, each of wrk's
#   keep-alive connections kept to pinlb by HAProxy; FRONT_SERVER='send-proxy-v2' adds that to
#   HAProxy's server line, so with LISTENER_TOML='proxy_protocol = true ...' this counts what
#   accepting PROXY protocol v2 costs per request against the same run without both.
#   (HAProxy decides for itself when to close its private send-proxy connections; under
#   valgrind's slowness it closed most of them after one request, so for that cost use:)
#   CLIENT=py | CLIENT=proxy-v2  drives pinlb with benches/keepalive_client.py instead of wrk:
#   16 keep-alive connections, with proxy-v2 each beginning with a PROXY v2 header; compare
#   LISTENER_TOML='proxy_protocol = true …' CLIENT=proxy-v2 against CLIENT=py.
#   CLIENT=h2c  drives pinlb with h2load (one thread, 16 connections of 10 concurrent streams,
#   HTTP/2 with prior knowledge) for the HTTP/2 client side's cost; it sets the listener's
#   `h2c = true` and the upstream's `keepalive = 1024`, as benches/h2.sh does.
#   SUBJECT=nginx  counts nginx instead of pinlb, as the proxy in the same place (one worker,
#   `master_process off`, benches/peers/nginx.conf: the configuration benches/compare.sh runs),
#   so that pinlb's count is set beside nginx's from the same harness; PINLB_BINARY is then
#   ignored. Only with the default CLIENT and no FRONT.
#   BODY_BYTES=N  the backend answers a JSON document of about N bytes (benches/peers/json_doc.py,
#   application/json, with its Content-Length) instead of "hello world", and wrk asks for
#   ACCEPT_ENCODING (default gzip): with LISTENER_TOML='compress = { algorithms = ["gzip"],
#   gzip_level = 1, types = ["application/json"] }' this counts a compressed response
#   (BODY_BYTES=3400 is issue 53's 3,314-byte document).
#   NGINX_GZIP_LEVEL=N  with SUBJECT=nginx: gzip on at that level for application/json, to set
#   nginx's count per compressed response beside pinlb's.
#   CACHE_SIM=1  adds valgrind's cache simulation (--cache-sim=yes: L1 instruction and data,
#   last level) and prints the misses per request too. About twice as slow, so fewer requests
#   are done in the 4 s; the instructions per request stayed put (pinlb 10,270 with it, 10,238
#   without; nginx 19,105 and 19,022).
# Needs: valgrind, nginx, wrk, curl, taskset (apt-get install -y valgrind nginx-light wrk), and
# haproxy for FRONT=haproxy, h2load (nghttp2-client) for CLIENT=h2c.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLB=${1:-$ROOT/target/release/pinlb}
BACKEND_PORT=${BACKEND_PORT:-18180}
PORT=${PORT:-18181}
FRONT_PORT=${FRONT_PORT:-18182}
WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

wait_port() {
    for _ in $(seq 100); do
        if [[ ${2:-} == proxy-v2 ]]; then
            python3 "$ROOT/benches/keepalive_client.py" "$1" --conns 1 --seconds 0.05 --proxy-v2 \
                >/dev/null 2>&1 && return 0
        else
            curl -s -o /dev/null "http://127.0.0.1:$1/" && return 0
        fi
        sleep 0.2
    done
    echo "nothing answers on port $1" >&2
    exit 1
}

mkdir -p "$WORK/backend/tmp"
{
    echo "client_body_temp_path $WORK/backend/tmp/body;"
    for m in proxy fastcgi uwsgi scgi; do echo "${m}_temp_path $WORK/backend/tmp/$m;"; done
} >"$WORK/backend/temp_paths.conf"
sed -e "s|@DIR@|$WORK/backend|g" -e "s|@BACKEND_PORT@|$BACKEND_PORT|g" \
    "$ROOT/benches/peers/backend-nginx.conf" >"$WORK/backend/nginx.conf"
WRK_HEADERS=()
if [[ -n ${BODY_BYTES:-} ]]; then
    mkdir -p "$WORK/backend/www"
    python3 "$ROOT/benches/peers/json_doc.py" "$BODY_BYTES" "$WORK/backend/www/data.json"
    # nginx's workers run as nobody when this runs as root: they must read the document.
    chmod a+rx "$WORK" "$WORK/backend" "$WORK/backend/www"
    chmod a+r "$WORK/backend/www/data.json"
    sed -i -e "s|return 200 \"hello world\\\\n\";|root $WORK/backend/www; default_type application/json; try_files /data.json =404;|" \
        "$WORK/backend/nginx.conf"
    grep -q 'try_files /data.json' "$WORK/backend/nginx.conf" || { echo "could not point the backend at the document" >&2; exit 1; }
    WRK_HEADERS=(-H "Accept-Encoding: ${ACCEPT_ENCODING:-gzip}")
fi
taskset -c 1 nginx -p "$WORK/backend" -c "$WORK/backend/nginx.conf" -e "$WORK/backend/error.log" &
PIDS+=($!)
wait_port "$BACKEND_PORT"

KEEPALIVE=64
if [[ ${CLIENT:-} == h2c ]]; then
    LISTENER_TOML="h2c = true
${LISTENER_TOML:-}"
    KEEPALIVE=1024
fi
cat >"$WORK/pinlb.toml" <<EOF
[runtime]
cpus = [0]
[[listener]]
address = "127.0.0.1:$PORT"
upstream = "app"
${LISTENER_TOML:-}
[upstream.app]
keepalive = $KEEPALIVE
backends = [{ address = "127.0.0.1:$BACKEND_PORT" }]
${EXTRA_TOML:-}
EOF
VALGRIND=(valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out")
if [[ ${CACHE_SIM:-0} == 1 ]]; then VALGRIND+=(--cache-sim=yes); fi
case ${SUBJECT:-pinlb} in
    pinlb)
        RUST_LOG=warn "${VALGRIND[@]}" "$PINLB" serve -c "$WORK/pinlb.toml" 2>"$WORK/valgrind.log" &
        ;;
    nginx)
        [[ -z ${FRONT:-} && -z ${CLIENT:-} ]] || { echo "SUBJECT=nginx takes neither FRONT nor CLIENT" >&2; exit 2; }
        mkdir -p "$WORK/nginx/tmp"
        sed -e "s|$WORK/backend/|$WORK/nginx/|g" "$WORK/backend/temp_paths.conf" >"$WORK/nginx/temp_paths.conf"
        sed -e "s|@DIR@|$WORK/nginx|g" -e "s|@PORT@|$PORT|g" -e "s|@BACKEND_PORT@|$BACKEND_PORT|g" \
            -e 's|^master_process on;|master_process off;|' \
            "$ROOT/benches/peers/nginx.conf" >"$WORK/nginx/nginx.conf"
        grep -q '^master_process off;' "$WORK/nginx/nginx.conf" || { echo "benches/peers/nginx.conf has no 'master_process on;' to turn off" >&2; exit 1; }
        if [[ -n ${NGINX_GZIP_LEVEL:-} ]]; then
            sed -i -e "s|^    gzip off;|    gzip on; gzip_comp_level $NGINX_GZIP_LEVEL; gzip_types application/json; gzip_proxied any;|" \
                "$WORK/nginx/nginx.conf"
            grep -q '^    gzip on;' "$WORK/nginx/nginx.conf" || { echo "benches/peers/nginx.conf has no 'gzip off;' to turn on" >&2; exit 1; }
        fi
        PINLB="nginx ($(nginx -v 2>&1 | sed 's|.*/||'), benches/peers/nginx.conf)"
        taskset -c 0 "${VALGRIND[@]}" nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" \
            -e "$WORK/nginx/error.log" 2>"$WORK/valgrind.log" &
        ;;
    *) echo "SUBJECT is pinlb or nginx" >&2; exit 2 ;;
esac
VG=$!
PIDS+=("$VG")
TARGET=$PORT
if [[ ${FRONT:-} == haproxy ]]; then
    cat >"$WORK/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    option http-keep-alive
    http-reuse always
    timeout connect 5s
    timeout client 300s
    timeout server 300s
    timeout http-keep-alive 300s
frontend fe
    bind 127.0.0.1:$FRONT_PORT
    default_backend app
backend app
    server pinlb 127.0.0.1:$PORT ${FRONT_SERVER:-}
EOF
    taskset -c 1 haproxy -f "$WORK/haproxy.cfg" &
    PIDS+=($!)
    TARGET=$FRONT_PORT
fi
wait_port "$TARGET" "${CLIENT:-}"

load() {
    case ${CLIENT:-wrk} in
        wrk) taskset -c 1 wrk -t1 -c16 -d"$1"s "${WRK_HEADERS[@]}" "http://127.0.0.1:$TARGET/" ;;
        py) taskset -c 1 python3 "$ROOT/benches/keepalive_client.py" "$TARGET" --seconds "$1" ;;
        proxy-v2) taskset -c 1 python3 "$ROOT/benches/keepalive_client.py" "$TARGET" --seconds "$1" --proxy-v2 ;;
        # h2load's count, written as wrk's line for the count below.
        h2c) taskset -c 1 h2load -t1 -c16 -m10 -D "$1" "http://127.0.0.1:$TARGET/" |
            awk '/^requests:/ { print $8, "requests in" }' ;;
        *) echo "CLIENT is wrk, py, proxy-v2 or h2c" >&2; exit 2 ;;
    esac
}
load 2 >/dev/null
callgrind_control -z "$VG" >/dev/null 2>&1
out=$(load 4)
callgrind_control -d "$VG" >/dev/null 2>&1
requests=$(awk '/requests in/{print $1}' <<<"$out")
cp "$WORK/cg.out.1" "${KEEP_PROFILE:-/dev/null}" 2>/dev/null || true
# PROGRAM TOTALS: Ir, then with the cache simulation Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw.
read -r ir _ _ i1 d1r d1w ll_i ll_dr ll_dw < <(callgrind_annotate "$WORK/cg.out.1" 2>/dev/null |
    awk '/PROGRAM TOTALS/ { n = 0; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9,]+$/) { gsub(",", "", $i); v[++n] = $i }
        for (i = 1; i <= 9; i++) printf "%d ", v[i]; print ""; exit }')
echo "binary:   $PINLB"
echo "requests: $requests"
echo "Ir:       $ir"
echo "Ir/req:   $((ir / requests))"
if [[ ${CACHE_SIM:-0} == 1 ]]; then
    awk -v n="$requests" -v ir="$ir" -v i1="$i1" -v d1=$((d1r + d1w)) -v ll=$((ll_i + ll_dr + ll_dw)) 'BEGIN {
        printf "L1 instruction misses/req: %.0f (%.2f%% of instructions)\n", i1 / n, 100 * i1 / ir
        printf "L1 data misses/req:        %.0f\n", d1 / n
        printf "last-level misses/req:     %.1f\n", ll / n }'
fi
