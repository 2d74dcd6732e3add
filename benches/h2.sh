#!/usr/bin/env bash
# benches/h2.sh - HTTP/2 clients through the proxy to an HTTP/1.1 backend: req/s and the
# proxy's CPU per request, pinlb vs nginx, over TLS (ALPN h2) and over h2c (prior knowledge),
# in interleaved rounds (issue 16's bars).
#
# Topology (as benches/tls.sh): the proxy under test on core 0 with one worker
# (benches/peers/pinlb-h2.toml, benches/peers/nginx-h2.conf: the same ECDSA P-256
# certificate); the backend (nginx `return 200`, benches/peers/backend-nginx.conf) and h2load
# on core 1. h2load: one thread, $CONNS connections x $STREAMS concurrent streams each, for
# $DURATION seconds, GET / (12-byte body); its 64 handshakes are in the run, next to some
# hundred thousand requests.
#
# Per round and peer: one start, then h2load over TLS, then over h2c; the proxy's CPU (utime +
# stime of its processes, from /proc) over each run, divided by the requests done in it.
# Prints one line per round, peer and mode, then the medians.
#
# Usage: bash benches/h2.sh
#   PEERS="pinlb=target/release/pinlb nginx"   NAME=BINARY for pinlb builds
#   ROUNDS=5 DURATION=5 CONNS=64 STREAMS=10
# Needs: nginx, h2load (nghttp2-client), openssl, curl, taskset.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PEERS=${PEERS:-pinlb=$ROOT/target/release/pinlb nginx}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
CONNS=${CONNS:-64}
STREAMS=${STREAMS:-10}
BACKEND_PORT=${BACKEND_PORT:-18380}
PORT=${PORT:-18381}
H2C_PORT=${H2C_PORT:-18382}
PATH="$PATH:/usr/sbin:/sbin"
WORK=$(mktemp -d)
PIDS=()
h2_cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
log() { echo "h2.sh: $*" >&2; }
die() { log "$*"; exit 1; }
PORT_BASE=$PORT
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
trap h2_cleanup EXIT

install_missing "nginx-light nghttp2-client openssl curl" nginx h2load openssl curl
require taskset

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=bench.test -addext subjectAltName=DNS:bench.test \
    -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null

nginx_temp_paths "$WORK"
render() { # TEMPLATE OUT
    sed -e "s|@DIR@|$WORK|g" -e "s|@BACKEND_PORT@|$BACKEND_PORT|g" -e "s|@PORT@|$PORT|g" \
        -e "s|@H2C_PORT@|$H2C_PORT|g" "$1" >"$2"
}
render "$ROOT/benches/peers/backend-nginx.conf" "$WORK/backend.conf"
mkdir -p "$WORK/backend" "$WORK/proxy"
sed -i "s|$WORK/nginx.pid|$WORK/backend/nginx.pid|; s|$WORK/error.log|$WORK/backend/error.log|" \
    "$WORK/backend.conf"
taskset -c 1 nginx -p "$WORK/backend" -c "$WORK/backend.conf" >"$WORK/backend.log" 2>&1 &
PIDS+=($!)
wait_ready backend "$BACKEND_PORT" "${PIDS[0]}" "$WORK/backend.log"

render "$ROOT/benches/peers/pinlb-h2.toml" "$WORK/pinlb.toml"
render "$ROOT/benches/peers/nginx-h2.conf" "$WORK/proxy.conf"
sed -i "s|$WORK/nginx.pid|$WORK/proxy/nginx.pid|; s|$WORK/error.log|$WORK/proxy/error.log|" \
    "$WORK/proxy.conf"

start_peer() { # PEER -> sets PEER_PID; both listeners answer over HTTP/2
    local name=${1%%=*} bin=${1#*=} i
    if [[ $name == nginx ]]; then
        taskset -c 0 nginx -p "$WORK/proxy" -c "$WORK/proxy.conf" >"$WORK/proxy.log" 2>&1 &
    else
        "$bin" serve -c "$WORK/pinlb.toml" >"$WORK/proxy.log" 2>&1 &
    fi
    PEER_PID=$!
    for ((i = 0; i < 50; i++)); do
        if [[ $(curl -sk --http2 --max-time 1 --resolve "bench.test:$PORT:127.0.0.1" \
            -w '%{http_version}' -o /dev/null "https://bench.test:$PORT/") == 2 ]] &&
            [[ $(curl -s --http2-prior-knowledge --max-time 1 -w '%{http_version}' \
                -o /dev/null "http://127.0.0.1:$H2C_PORT/") == 2 ]]; then
            return 0
        fi
        sleep 0.1
    done
    cat "$WORK/proxy.log" >&2
    die "$name does not answer HTTP/2 on both listeners"
}

stop_peer() {
    local pids i
    pids=$(proc_tree "$PEER_PID")
    # shellcheck disable=SC2086
    kill $pids 2>/dev/null || true
    wait "$PEER_PID" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        port_in_use "$PORT" || port_in_use "$H2C_PORT" || return 0
        sleep 0.1
    done
}

# run URL -> "REQS RATE": requests done and req/s; a run with any answer but 2xx fails.
run() {
    local out done rate
    out=$(taskset -c 1 h2load -t1 -c"$CONNS" -m"$STREAMS" -D"$DURATION" "$1" 2>&1) ||
        die "h2load failed: $out"
    # requests: N total, N started, N done, N succeeded, N failed, N errored, N timeout
    done=$(awk '/^requests:/ { print $8 }' <<<"$out")
    # finished in 5.00s, 22812.80 req/s, 1.66MB/s
    rate=$(awk '/^finished in/ { gsub(",", ""); print $4 }' <<<"$out")
    # status codes: N 2xx, N 3xx, N 4xx, N 5xx
    awk '/^status codes:/ { if ($3 + 0 > 0 && $5 + $7 + $9 == 0) ok = 1 } END { exit !ok }' <<<"$out" ||
        die "not every answer was 2xx: $out"
    [[ $(awk '/^requests:/ { print $10 + $12 }' <<<"$out") == 0 ]] || die "failed requests: $out"
    echo "$done $rate"
}

printf '%-12s %-5s %5s %10s %10s\n' peer mode round "req/s" "CPU µs/req" | tee "$WORK/results"
hz=$(getconf CLK_TCK)
for ((round = 1; round <= ROUNDS; round++)); do
    for peer in $PEERS; do
        start_peer "$peer"
        for mode in tls h2c; do
            if [[ $mode == tls ]]; then url="https://127.0.0.1:$PORT/"; else url="http://127.0.0.1:$H2C_PORT/"; fi
            pids=$(proc_tree "$PEER_PID")
            # shellcheck disable=SC2086
            t0=$(cpu_ticks $pids)
            res=$(run "$url")
            read -r reqs rate <<<"$res"
            # shellcheck disable=SC2086
            t1=$(cpu_ticks $pids)
            cpu=$(awk -v t=$((t1 - t0)) -v hz="$hz" -v n="$reqs" \
                'BEGIN { printf "%.2f", (n > 0) ? t / hz * 1e6 / n : 0 }')
            printf '%-12s %-5s %5d %10.0f %10s\n' "${peer%%=*}" "$mode" "$round" "$rate" "$cpu" |
                tee -a "$WORK/results"
        done
        stop_peer
    done
done

echo
echo "medians over $ROUNDS rounds of ${DURATION}s, h2load -c$CONNS -m$STREAMS:"
for peer in $PEERS; do
    for mode in tls h2c; do
        awk -v n="${peer%%=*}" -v m="$mode" '$1 == n && $2 == m { r[++k] = $4; c[k] = $5 }
            function med(a, k,   i, j, t) {
                for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
            }
            END { printf "%-12s %-4s req/s %.0f  CPU µs/req %.2f\n", n, m, med(r, k), med(c, k) }' \
            "$WORK/results"
    done
done
