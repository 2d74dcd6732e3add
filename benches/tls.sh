#!/usr/bin/env bash
# benches/tls.sh - HTTPS through the proxy: keep-alive req/s and CPU per request, and full
# handshakes per second, for pinlb builds (e.g. one per rustls crypto provider) and nginx, with
# the same ECDSA P-256 certificate, in interleaved rounds.
#
# Topology (as benches/compare.sh): the proxy under test on core 0 with one worker; the backend
# (nginx `return 200`, benches/peers/backend-nginx.conf) and wrk on core 1. wrk speaks TLS 1.3
# through OpenSSL and never resumes a session, so with `Connection: close` every request is a
# new TCP connection and a full handshake (X25519, ECDSA P-256 signature).
#
# Per round and peer: wrk -c16 keep-alive for $DURATION (req/s, and the proxy's CPU µs per
# request from /proc), then wrk -c16 with `Connection: close` for $DURATION (handshakes/s, and
# the proxy's CPU µs per handshake, its request included).
# Prints one line per round and peer, then the medians.
#
# Usage: bash benches/tls.sh
#   PEERS="aws-lc-rs=/tmp/pinlb-aws ring=/tmp/pinlb-ring nginx"   NAME=BINARY for pinlb builds
#   ROUNDS=5 DURATION=5s
# Needs: nginx, wrk, openssl, curl, taskset (apt-get install -y nginx-light wrk openssl).
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PEERS=${PEERS:-pinlb=$ROOT/target/release/pinlb nginx}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5s}
BACKEND_PORT=${BACKEND_PORT:-18280}
PORT=${PORT:-18281}
PATH="$PATH:/usr/sbin:/sbin"
WORK=$(mktemp -d)
PIDS=()
tls_cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
die() { echo "tls.sh: $*" >&2; exit 1; }
PORT_BASE=$PORT
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
trap tls_cleanup EXIT

for tool in nginx wrk openssl curl taskset; do
    command -v "$tool" >/dev/null || die "needs $tool (apt-get install -y nginx-light wrk openssl curl)"
done

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=bench.test -addext subjectAltName=DNS:bench.test \
    -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null

nginx_temp_paths "$WORK"
sed -e "s|@DIR@|$WORK|g" -e "s|@BACKEND_PORT@|$BACKEND_PORT|g" \
    "$ROOT/benches/peers/backend-nginx.conf" >"$WORK/backend.conf"
mkdir -p "$WORK/backend"
taskset -c 1 nginx -p "$WORK" -c "$WORK/backend.conf" >"$WORK/backend.log" 2>&1 &
PIDS+=($!)
sleep 0.5

# The proxies' configurations.
cat >"$WORK/pinlb.toml" <<EOF
[runtime]
cpus = [0]
[limits]
max_connections = 4096
[[listener]]
address = "127.0.0.1:$PORT"
upstream = "app"
[listener.tls]
cert = "$WORK/cert.pem"
key = "$WORK/key.pem"
[upstream.app]
keepalive = 64
backends = [{ address = "127.0.0.1:$BACKEND_PORT" }]
EOF
mkdir -p "$WORK/proxy"
cat >"$WORK/proxy.conf" <<EOF
daemon off;
master_process on;
worker_processes 1;
pid $WORK/proxy/nginx.pid;
error_log $WORK/proxy/error.log warn;
events { worker_connections 4096; }
http {
    include $WORK/temp_paths.conf;
    access_log off;
    keepalive_requests 1000000;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:SSL:10m;
    upstream app { server 127.0.0.1:$BACKEND_PORT; keepalive 64; }
    server {
        listen 127.0.0.1:$PORT ssl;
        ssl_certificate $WORK/cert.pem;
        ssl_certificate_key $WORK/key.pem;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF

start_peer() { # PEER -> sets PEER_PID
    local name=${1%%=*} bin=${1#*=}
    if [[ $name == nginx ]]; then
        taskset -c 0 nginx -p "$WORK/proxy" -c "$WORK/proxy.conf" >"$WORK/proxy.log" 2>&1 &
    else
        "$bin" serve -c "$WORK/pinlb.toml" >"$WORK/proxy.log" 2>&1 &
    fi
    PEER_PID=$!
    for _ in $(seq 50); do
        curl -sk --max-time 1 --resolve "bench.test:$PORT:127.0.0.1" \
            "https://bench.test:$PORT/" -o /dev/null && return 0
        sleep 0.1
    done
    cat "$WORK/proxy.log" >&2
    die "$name does not answer over https"
}

stop_peer() {
    local pids
    pids=$(proc_tree "$PEER_PID")
    # shellcheck disable=SC2086
    kill $pids 2>/dev/null || true
    wait "$PEER_PID" 2>/dev/null || true
    for _ in $(seq 50); do port_in_use "$PORT" || return 0; sleep 0.1; done
}

wrk_rate() { # EXTRA_ARGS... -> requests/s; a run with any answer but 200 fails
    local out
    out=$(taskset -c 1 wrk -t1 -c16 -d"$DURATION" "$@" "https://127.0.0.1:$PORT/" 2>&1)
    [[ $out != *Non-2xx* ]] || die "not every answer was 200: $out"
    awk '/^Requests\/sec:/ { print $2 }' <<<"$out"
}

printf '%-12s %5s %10s %10s %12s %10s\n' peer round "req/s" "CPU µs/req" "handshakes/s" "CPU µs/hs" |
    tee "$WORK/results"
hz=$(getconf CLK_TCK)
for ((round = 1; round <= ROUNDS; round++)); do
    for peer in $PEERS; do
        start_peer "$peer"
        taskset -c 1 wrk -t1 -c16 -d1s "https://127.0.0.1:$PORT/" >/dev/null 2>&1 || true
        pids=$(proc_tree "$PEER_PID")
        # shellcheck disable=SC2086
        t0=$(cpu_ticks $pids)
        rate=$(wrk_rate)
        # shellcheck disable=SC2086
        t1=$(cpu_ticks $pids)
        secs=${DURATION%s}
        cpu=$(awk -v t=$((t1 - t0)) -v hz="$hz" -v r="$rate" -v s="$secs" \
            'BEGIN { printf "%.2f", (r > 0) ? t / hz * 1e6 / (r * s) : 0 }')
        # shellcheck disable=SC2086
        t0=$(cpu_ticks $pids)
        shakes=$(wrk_rate -H "Connection: close")
        # shellcheck disable=SC2086
        t1=$(cpu_ticks $pids)
        hcpu=$(awk -v t=$((t1 - t0)) -v hz="$hz" -v r="$shakes" -v s="$secs" \
            'BEGIN { printf "%.1f", (r > 0) ? t / hz * 1e6 / (r * s) : 0 }')
        stop_peer
        printf '%-12s %5d %10.0f %10s %12.0f %10s\n' "${peer%%=*}" "$round" "$rate" "$cpu" "$shakes" "$hcpu" |
            tee -a "$WORK/results"
    done
done

echo
echo "medians over $ROUNDS rounds of $DURATION:"
for peer in $PEERS; do
    name=${peer%%=*}
    awk -v n="$name" '$1 == n { r[++k] = $3; c[k] = $4; h[k] = $5; u[k] = $6 }
        function med(a, k,   i, j, t) {
            for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
            return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
        }
        END { printf "%-12s req/s %.0f  CPU µs/req %.2f  handshakes/s %.0f  CPU µs/handshake %.1f\n", n, med(r, k), med(c, k), med(h, k), med(u, k) }' \
        "$WORK/results"
done
