#!/usr/bin/env bash
# benches/tls.sh - HTTPS through the proxy: keep-alive req/s and CPU per request, full
# handshakes per second and resumed handshakes per second (each with the proxy's CPU per
# handshake), for pinlb builds (e.g. one per rustls crypto provider) and nginx, with the same
# ECDSA P-256 certificate, in interleaved rounds.
#
# Topology (as benches/compare.sh): the proxy under test on core 0 with one worker; the backend
# (nginx `return 200`, benches/peers/backend-nginx.conf) and the clients on core 1.
#
# Per round and peer:
# - keep-alive: wrk -c16 for $DURATION (req/s; the proxy's CPU µs per request from /proc);
# - full handshakes: back-to-back `h2load --h1 -c $BATCH -n $BATCH` runs for about $DURATION:
#   each of the $BATCH clients makes one connection and one request, and a client resumes only
#   on its own later connections, so every handshake is a full one (X25519, ECDSA P-256
#   signature). The rate is the handshakes over the runs' own times (h2load's "finished in"),
#   the CPU per handshake is the proxy's over the whole loop, its one request included;
# - resumed handshakes: back-to-back `h2load --h1 -c16 -n $((BATCH * 20)) -H "Connection:
#   close"` runs for about $DURATION: each client reconnects after every response and resumes
#   the session of its previous connection (all but the first 16 handshakes of a run). Not
#   h2load's -D: with Connection: close, h2load 1.52's timed mode never ends (its clients
#   reconnect in a loop, sending nothing).
# Checked on pinlb with pinlb_tls_handshakes_total and pinlb_tls_resumed_total: 100 clients of
# one request give 100 handshakes, 0 resumed; with Connection: close, 200 requests over 4
# clients give 200 handshakes, 196 resumed. wrk resumes as h2load does (352 handshakes, 348
# resumed, over 4 connections), which is why wrk with Connection: close measures resumed
# handshakes, not full ones.
# Prints one line per round and peer, then the medians.
#
# Usage: bash benches/tls.sh
#   PEERS="aws-lc-rs=/tmp/pinlb-aws ring=/tmp/pinlb-ring nginx"   NAME=BINARY for pinlb builds
#   ROUNDS=5 DURATION=5s BATCH=100
# Needs: nginx, wrk, h2load, openssl, curl, taskset
#   (apt-get install -y nginx-light wrk nghttp2-client openssl curl).
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PEERS=${PEERS:-pinlb=$ROOT/target/release/pinlb nginx}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5s}
BATCH=${BATCH:-100}
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

for tool in nginx wrk h2load openssl curl taskset; do
    command -v "$tool" >/dev/null || die "needs $tool (apt-get install -y nginx-light wrk nghttp2-client openssl curl)"
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

h2load_run() { # ARGS... -> "REQUESTS SECONDS": the 2xx answers and h2load's own time; fails
    # unless every request got one
    taskset -c 1 h2load --h1 "$@" "https://127.0.0.1:$PORT/" 2>&1 |
        awk '/^finished in/ { t = $3; sub(/,$/, "", t)
                 if (t ~ /ms$/) { sub(/ms$/, "", t); t /= 1000 } else if (t ~ /us$/) { sub(/us$/, "", t); t /= 1e6 } else sub(/s$/, "", t) }
             /^requests:/ { n = $2 }
             /^status codes:/ { ok = $3 }
             END { if (n == 0 || ok != n) exit 1; print ok, t }'
}

handshakes() { # H2LOAD_ARGS... -> "HANDSHAKES SECONDS" over back-to-back runs for about $DURATION
    local end=$((SECONDS + ${DURATION%s})) n=0 t=0 run
    while ((SECONDS < end)); do
        run=$(h2load_run "$@") || die "h2load $* failed"
        read -r n t < <(awk -v n="$n" -v t="$t" -v r="$run" 'BEGIN { split(r, a, " "); print n + a[1], t + a[2] }')
    done
    echo "$n $t"
}

printf '%-12s %5s %10s %10s %10s %10s %10s %10s\n' peer round "req/s" "CPU µs/req" "full/s" "CPU µs" \
    "resumed/s" "CPU µs" | tee "$WORK/results"
hz=$(getconf CLK_TCK)
per() { # TICKS COUNT -> CPU µs per item
    awk -v t="$1" -v hz="$hz" -v n="$2" 'BEGIN { printf "%.1f", (n > 0) ? t / hz * 1e6 / n : 0 }'
}
secs=${DURATION%s}
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
        cpu=$(per $((t1 - t0)) "$(awk -v r="$rate" -v s="$secs" 'BEGIN { print r * s }')")
        # shellcheck disable=SC2086
        t0=$(cpu_ticks $pids)
        read -r fn ft < <(handshakes -c "$BATCH" -n "$BATCH")
        [[ -n ${ft:-} ]] || die "no full-handshake figure for $peer"
        # shellcheck disable=SC2086
        t1=$(cpu_ticks $pids)
        full=$(awk -v n="$fn" -v t="$ft" 'BEGIN { printf "%.0f", n / t }')
        fcpu=$(per $((t1 - t0)) "$fn")
        # shellcheck disable=SC2086
        t0=$(cpu_ticks $pids)
        read -r rn rt < <(handshakes -c16 -n $((BATCH * 20)) -H "Connection: close")
        [[ -n ${rt:-} ]] || die "no resumed-handshake figure for $peer"
        # shellcheck disable=SC2086
        t1=$(cpu_ticks $pids)
        resumed=$(awk -v n="$rn" -v t="$rt" 'BEGIN { printf "%.0f", n / t }')
        rcpu=$(per $((t1 - t0)) "$rn")
        stop_peer
        printf '%-12s %5d %10.0f %10.2f %10s %10s %10s %10s\n' "${peer%%=*}" "$round" "$rate" "$cpu" \
            "$full" "$fcpu" "$resumed" "$rcpu" | tee -a "$WORK/results"
    done
done

echo
echo "medians over $ROUNDS rounds of $DURATION:"
for peer in $PEERS; do
    name=${peer%%=*}
    awk -v n="$name" '$1 == n { r[++k] = $3; c[k] = $4; f[k] = $5; fc[k] = $6; s[k] = $7; sc[k] = $8 }
        function med(a, k,   i, j, t) {
            for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
            return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
        }
        END { printf "%-12s req/s %.0f  CPU µs/req %.2f  full handshakes/s %.0f  CPU µs/full %.1f  resumed/s %.0f  CPU µs/resumed %.1f\n",
                  n, med(r, k), med(c, k), med(f, k), med(fc, k), med(s, k), med(sc, k) }' \
        "$WORK/results"
done
