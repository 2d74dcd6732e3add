#!/usr/bin/env bash
# benches/tcp.sh - pinlb's TCP listener (`mode = "tcp"`) against HAProxy (`mode tcp`) and nginx
# (`stream`), relaying Redis, in one run with interleaved rounds.
#
# Topology (meant for a 2-core machine):
#   core 0: the proxy under test, ONE worker (pinlb cpus = [0]; haproxy nbthread 1; nginx
#           worker_processes 1), each started once for the whole run on its own port.
#   core 1: one redis-server (--save "" --appendonly no) and the load generator,
#           redis-benchmark, both `taskset -c 1`.
# Each proxy relays every connection to the one redis-server, with no log.
#
# Per round and proxy (pinlb, haproxy, nginx, then the next round):
#   small  `redis-benchmark -q -t get,set -c $CONNS -n $REQUESTS`: SET and GET req/s (the
#          issue's figure), and the proxy's CPU (utime+stime of all its processes, from
#          /proc/PID/stat) per request over both, in microseconds; and how busy each core was
#          over the run (/proc/stat: all but idle and iowait), which says which side limits:
#          a proxy can only raise req/s while its own core is the busy one.
#   bulk   `redis-benchmark -q -t set,get -c 8 -n $BULK_N -d $BULK_BYTES`: values of
#          $BULK_BYTES bytes each way, reported as MB/s relayed (SET's and GET's req/s x size)
#          and the proxy's CPU per MB.
#   direct the same two runs against redis-server itself once per round (no proxy): the
#          ceiling, and the check that the backend is not what limits.
# Summary: the median over rounds of each figure, and pinlb's ratio to each peer.
#
# Usage: bash benches/tcp.sh
# Environment: ROUNDS=5 CONNS=50 REQUESTS=200000 BULK_N=20000 BULK_BYTES=65536
#              PINLB=target/release/pinlb  OUT_MD=benches/tcp-results.md
#              PINLB_BASE=path: a second pinlb binary, run as "base" in the same rounds (a
#              change's before and after, paired)
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}
CONNS=${CONNS:-50}
REQUESTS=${REQUESTS:-200000}
BULK_N=${BULK_N:-20000}
BULK_BYTES=${BULK_BYTES:-65536}
PINLB=${PINLB:-target/release/pinlb}
OUT_MD=${OUT_MD:-benches/tcp-results.md}
PORT_BASE=${PORT_BASE:-27100}

log() { echo "tcp.sh: $*" >&2; }
die() {
    log "$*"
    exit 1
}
# shellcheck source=benches/lib.sh
source benches/lib.sh

for tool in redis-server redis-benchmark haproxy nginx taskset; do
    command -v "$tool" >/dev/null 2>&1 || [[ -x /usr/sbin/$tool ]] ||
        die "needs $tool (apt-get install redis-server redis-tools haproxy nginx libnginx-mod-stream)"
done
[[ -f /usr/lib/nginx/modules/ngx_stream_module.so ]] ||
    die "needs nginx's stream module (apt-get install libnginx-mod-stream)"
[[ -x $PINLB ]] || die "no $PINLB: cargo build --release -p pinlb"

WORK=$(mktemp -d /tmp/pinlb-tcp-bench.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    [[ -n ${KEEP_WORK:-} ]] || rm -rf "$WORK"
}
trap cleanup EXIT
KEEP_WORK=${KEEP_WORK:-}

pick_port; REDIS=$PICKED
taskset -c 1 redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no \
    --logfile "$WORK/redis.log" &
PIDS+=($!)

pick_port; PINLB_PORT=$PICKED
cat >"$WORK/pinlb.toml" <<EOF
[runtime]
cpus = [0]

[[listener]]
address = "127.0.0.1:$PINLB_PORT"
mode = "tcp"
upstream = "redis"

[upstream.redis]
backends = [{ address = "127.0.0.1:$REDIS" }]
EOF
"$PINLB" serve -c "$WORK/pinlb.toml" >"$WORK/pinlb.log" 2>&1 &
PINLB_PID=$!
PIDS+=($PINLB_PID)
PROXIES="pinlb haproxy nginx direct"
if [[ -n ${PINLB_BASE:-} ]]; then
    pick_port; BASE_PORT=$PICKED
    sed "s/127.0.0.1:$PINLB_PORT/127.0.0.1:$BASE_PORT/" "$WORK/pinlb.toml" >"$WORK/base.toml"
    "$PINLB_BASE" serve -c "$WORK/base.toml" >"$WORK/base.log" 2>&1 &
    BASE_PID=$!
    PIDS+=($BASE_PID)
    PROXIES="pinlb base haproxy nginx direct"
fi

pick_port; HAPROXY_PORT=$PICKED
cat >"$WORK/haproxy.cfg" <<EOF
global
    nbthread 1
    cpu-map 1/1 0
    maxconn 4000
defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
frontend redis
    bind 127.0.0.1:$HAPROXY_PORT
    default_backend redis
backend redis
    server r1 127.0.0.1:$REDIS
EOF
taskset -c 0 haproxy -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.log" 2>&1 &
HAPROXY_PID=$!
PIDS+=($HAPROXY_PID)

pick_port; NGINX_PORT=$PICKED
cat >"$WORK/nginx.conf" <<EOF
load_module /usr/lib/nginx/modules/ngx_stream_module.so;
worker_processes 1;
worker_cpu_affinity 01;
daemon off;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log;
events { worker_connections 10000; }
stream {
    upstream redis { server 127.0.0.1:$REDIS; }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        proxy_pass redis;
        proxy_timeout 1h;
    }
}
EOF
taskset -c 0 nginx -c "$WORK/nginx.conf" >"$WORK/nginx.log" 2>&1 &
NGINX_PID=$!
PIDS+=($NGINX_PID)

# Every port answers a PING before the first round.
for port in "$REDIS" "$PINLB_PORT" ${BASE_PORT:-} "$HAPROXY_PORT" "$NGINX_PORT"; do
    ok=
    for _ in $(seq 1 100); do
        if [[ $(redis-cli -p "$port" PING 2>/dev/null) == PONG ]]; then
            ok=1
            break
        fi
        sleep 0.1
    done
    [[ -n $ok ]] || die "port $port does not answer PING"
done

declare -A PROXY_PORT=([pinlb]=$PINLB_PORT [base]=${BASE_PORT:-0} [haproxy]=$HAPROXY_PORT [nginx]=$NGINX_PORT [direct]=$REDIS)
declare -A PROXY_PID=([pinlb]=$PINLB_PID [base]=${BASE_PID:-0} [haproxy]=$HAPROXY_PID [nginx]=$NGINX_PID)
tree_ticks() { # NAME: the CPU ticks of the proxy's processes (0 for direct)
    [[ $1 == direct ]] && { echo 0; return; }
    # shellcheck disable=SC2046
    cpu_ticks $(proc_tree "${PROXY_PID[$1]}")
}
TICK_US=$((1000000 / $(getconf CLK_TCK)))

# core_busy: "BUSY TOTAL" jiffies of cpu0 and cpu1 from /proc/stat, as "b0 t0 b1 t1".
core_busy() {
    awk '$1 == "cpu0" || $1 == "cpu1" {t = 0; for (i = 2; i <= 9; i++) t += $i; printf "%d %d ", t - $5 - $6, t}' /proc/stat
}
# busy_pct BEFORE AFTER CORE: the core's busy share between two core_busy readings, in percent.
busy_pct() {
    awk -v a="$1" -v b="$2" -v c="$3" 'BEGIN {split(a, x, " "); split(b, y, " "); i = 2 * c + 1;
        printf "%.0f", 100 * (y[i] - x[i]) / (y[i + 1] - x[i + 1])}'
}

# rps OUTPUT TEST: the req/s redis-benchmark -q printed for TEST ("SET: 123456.79 requests per second").
rps() { awk -v t="$2:" '$1 == t {print $2}' <<<"$1" | tr -d '\r' | tail -1; }

RESULTS=$WORK/results.tsv
for round in $(seq 1 "$ROUNDS"); do
    for p in $PROXIES; do
        port=${PROXY_PORT[$p]}
        t0=$(tree_ticks "$p")
        c0=$(core_busy)
        out=$(taskset -c 1 redis-benchmark -p "$port" -q -t get,set -c "$CONNS" -n "$REQUESTS" 2>&1 | tr '\r' '\n')
        c1=$(core_busy)
        t1=$(tree_ticks "$p")
        busy0=$(busy_pct "$c0" "$c1" 0)
        busy1=$(busy_pct "$c0" "$c1" 1)
        set_rps=$(rps "$out" SET)
        get_rps=$(rps "$out" GET)
        cpu_us=$(awk -v d=$((t1 - t0)) -v u="$TICK_US" -v n="$REQUESTS" 'BEGIN {printf "%.2f", d * u / (2 * n)}')
        t0=$(tree_ticks "$p")
        bulk=$(taskset -c 1 redis-benchmark -p "$port" -q -t set,get -c 8 -n "$BULK_N" -d "$BULK_BYTES" 2>&1 | tr '\r' '\n')
        t1=$(tree_ticks "$p")
        mbs=$(awk -v s="$(rps "$bulk" SET)" -v g="$(rps "$bulk" GET)" -v b="$BULK_BYTES" \
            'BEGIN {printf "%.0f", (s + g) / 2 * b / 1e6}')
        mb=$(awk -v n="$BULK_N" -v b="$BULK_BYTES" 'BEGIN {print 2 * n * b / 1e6}')
        cpu_mb=$(awk -v d=$((t1 - t0)) -v u="$TICK_US" -v mb="$mb" 'BEGIN {printf "%.0f", d * u / mb}')
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$p" "$set_rps" "$get_rps" "$cpu_us" "$mbs" "$cpu_mb" \
            "$busy0" "$busy1" >>"$RESULTS"
        log "round $round $p: SET $set_rps/s GET $get_rps/s, ${cpu_us} us CPU/req, cores ${busy0}%/${busy1}% busy; bulk ${mbs} MB/s, ${cpu_mb} us CPU/MB"
    done
done

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
col() { awk -F'\t' -v p="$1" -v c="$2" '$2 == p {print $c}' "$RESULTS" | median; }
{
    echo "### TCP relay of Redis: pinlb vs HAProxy (mode tcp) vs nginx (stream), $(date -u +%F)"
    echo
    echo "\`ROUNDS=$ROUNDS bash benches/tcp.sh\`: proxy on core 0 (one worker/thread), redis-server and redis-benchmark on core 1;"
    echo "small: \`redis-benchmark -q -t get,set -c $CONNS -n $REQUESTS\`; bulk: \`-t set,get -c 8 -n $BULK_N -d $BULK_BYTES\`. Medians of $ROUNDS interleaved rounds."
    echo
    echo "| proxy | SET req/s | GET req/s | CPU us/req | core 0 busy | core 1 busy | bulk MB/s | CPU us/MB |"
    echo "|---|---|---|---|---|---|---|---|"
    for p in $PROXIES; do
        printf '| %s | %.0f | %.0f | %s | %s%% | %s%% | %s | %s |\n' "$p" "$(col "$p" 3)" "$(col "$p" 4)" "$(col "$p" 5)" \
            "$(col "$p" 8)" "$(col "$p" 9)" "$(col "$p" 6)" "$(col "$p" 7)"
    done
    echo
    for peer in ${PINLB_BASE:+base} haproxy nginx; do
        awk -v ps="$(col pinlb 3)" -v pg="$(col pinlb 4)" -v qs="$(col "$peer" 3)" -v qg="$(col "$peer" 4)" \
            -v pc="$(col pinlb 5)" -v qc="$(col "$peer" 5)" -v pb="$(col pinlb 6)" -v qb="$(col "$peer" 6)" -v peer="$peer" \
            'BEGIN {printf "pinlb / %s: SET %.2fx, GET %.2fx req/s, CPU per request %.2fx; bulk %.2fx MB/s\n", peer, ps / qs, pg / qg, pc / qc, pb / qb}'
    done
    echo
    echo "Every round:"
    echo
    echo '```'
    printf 'round\tproxy\tSET/s\tGET/s\tus/req\tMB/s\tus/MB\tbusy0%%\tbusy1%%\n'
    cat "$RESULTS"
    echo '```'
} | tee "$OUT_MD"
