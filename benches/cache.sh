#!/usr/bin/env bash
# benches/cache.sh - issue 50's micro-cache: pinlb's `cache` against nginx's `proxy_cache` with
# `proxy_cache_lock`, in front of three busy Node.js processes that answer
# `Cache-Control: max-age=1`, in interleaved rounds.
#
# Topology (meant for a 2-core machine):
#   core 0: the proxy under test, one worker (pinlb cpus = [0]; nginx worker_processes 1)
#   core 1: three Node.js processes (benches/peers/cache/node-busy-cached.js: the seeds' busy
#           loop of $BUSY_LOOP iterations per request, then `Cache-Control: max-age=1`) and the
#           load generator (wrk, ab), all `taskset -c 1`
#   pinlb:  [cache.micro] max_size = "64MiB"; cache = { zone = "micro" } (lock on, its default)
#   nginx:  proxy_cache_path (in $WORK) keys_zone=micro:10m max_size=64m; proxy_cache micro;
#           proxy_cache_lock on; upstream keepalive 64, HTTP/1.1 to the backends
#
# Per round and proxy:
#   wrk    `wrk -t1 -c64 -d${DURATION}s` on one key: req/s, the proxy's CPU per request (its
#          utime+stime from /proc), and the requests the backends saw per second (their
#          /__count before and after, read directly)
#   ab     `ab -k -c 1000 -t $DURATION` on another key: req/s, failed requests, backend req/s
#   cold   `ab -c 500 -n 500` on a key never asked for before: how many reached a backend
#          (the bar: 1)
# Then, for pinlb only, the memory run: `wrk -c 8 -d ${MEM_DURATION}s` with a script that asks
# for a new `/big/N` (64 KiB each) every request, until about $MEM_BYTES have passed through
# the cache, with the proxy's RSS sampled every 0.5 s: its peak beside max_size.
# Summary: medians over rounds, and pinlb's ratios to nginx. Markdown on stdout and $OUT_MD.
#
# Usage:   bash benches/cache.sh
# Env:     ROUNDS=3 DURATION=10 BUSY_LOOP=180000 PINLB=target/release/pinlb
#          OUT_MD=/tmp/pinlb-cache.md PORT_BASE=18680 KEEP_TMP=0 MEM=1 MEM_BYTES=1073741824
# Needs:   node, nginx, wrk, ab, curl, taskset.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
CMDLINE="bash $0${*:+ $*}"
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
BUSY_LOOP=${BUSY_LOOP:-180000}
PINLB=${PINLB:-target/release/pinlb}
OUT_MD=${OUT_MD:-/tmp/pinlb-cache.md}
PORT_BASE=${PORT_BASE:-18680}
KEEP_TMP=${KEEP_TMP:-0}
MEM=${MEM:-1}
MEM_BYTES=${MEM_BYTES:-1073741824}
case $PINLB in /*) ;; *) PINLB="$ROOT/$PINLB" ;; esac
PATH="$PATH:/usr/sbin:/sbin"

log() { printf '[cache] %s\n' "$*" >&2; }
die() {
    printf '[cache] ERROR: %s\n' "$*" >&2
    exit 1
}
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
install_missing "nginx-light apache2-utils nodejs wrk" nginx ab node wrk
require nginx ab node wrk curl taskset awk
[[ -x $PINLB ]] || die "no pinlb at $PINLB (cargo build --release -p pinlb)"
ulimit -n 20000 2>/dev/null || ulimit -n "$(ulimit -Hn)"

WORK=$(mktemp -d /tmp/pinlb-cache-bench.XXXXXX)
PIDS=()
WRK_PID=""
running_pids() { echo "${PIDS[*]:-} ${WRK_PID:-}"; }
install_cleanup

# Three backends on core 1.
BACKENDS=()
for i in 1 2 3; do
    pick_port
    BACKENDS+=("$PICKED")
    PORT=$PICKED BUSY_LOOP=$BUSY_LOOP MAX_AGE=1 taskset -c 1 node "$ROOT/benches/peers/cache/node-busy-cached.js" \
        >"$WORK/node-$i.log" 2>&1 &
    PIDS+=($!)
    wait_ready "node-$i" "$PICKED" "$!" "$WORK/node-$i.log"
done
backend_count() { # the requests the three backends have served
    local p n total=0
    for p in "${BACKENDS[@]}"; do
        n=$(curl -s --max-time 2 "http://127.0.0.1:$p/__count")
        total=$((total + n))
    done
    echo "$total"
}
servers_nginx=$(printf '        server 127.0.0.1:%s;\n' "${BACKENDS[@]}")
servers_pinlb=$(printf '{ address = "127.0.0.1:%s" }, ' "${BACKENDS[@]}")

declare -A PORT PID_OF
pick_port
PORT[pinlb]=$PICKED
pick_port
PORT[nginx]=$PICKED

mkdir -p "$WORK/pinlb" "$WORK/nginx/cache"
cat >"$WORK/pinlb/pinlb.toml" <<TOML
[runtime]
cpus = [0]

[cache.micro]
max_size = "64MiB"

[[listener]]
address = "127.0.0.1:${PORT[pinlb]}"
upstream = "app"
cache = { zone = "micro" }

[upstream.app]
backends = [${servers_pinlb%, }]
TOML
"$PINLB" check -c "$WORK/pinlb/pinlb.toml" >"$WORK/pinlb/check.log" 2>&1 || {
    cat "$WORK/pinlb/check.log" >&2
    die "pinlb check refused the configuration: this binary may predate the cache"
}
RUST_LOG=warn taskset -c 0 "$PINLB" serve -c "$WORK/pinlb/pinlb.toml" >"$WORK/pinlb/out.log" 2>&1 &
PID_OF[pinlb]=$!
PIDS+=($!)
wait_ready pinlb "${PORT[pinlb]}" "${PID_OF[pinlb]}" "$WORK/pinlb/out.log"

nginx_temp_paths "$WORK/nginx"
# nginx's worker runs as nobody when the script runs as root: it writes the cache and its temp
# files here.
chmod a+x "$WORK"
chmod -R a+rwx "$WORK/nginx"
cat >"$WORK/nginx/nginx.conf" <<CONF
daemon off;
worker_processes 1;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 20000; }
worker_rlimit_nofile 20000;
http {
    include $WORK/nginx/temp_paths.conf;
    access_log off;
    keepalive_requests 1000000;
    proxy_cache_path $WORK/nginx/cache levels=1:2 keys_zone=micro:10m max_size=64m;
    upstream app {
$servers_nginx
        keepalive 64;
    }
    server {
        listen 127.0.0.1:${PORT[nginx]} backlog=4096;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache micro;
            proxy_cache_lock on;
        }
    }
}
CONF
taskset -c 0 nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >"$WORK/nginx/out.log" 2>&1 &
PID_OF[nginx]=$!
PIDS+=($!)
wait_ready nginx "${PORT[nginx]}" "${PID_OF[nginx]}" "$WORK/nginx/error.log"

TICK_US=$((1000000 / $(getconf CLK_TCK)))
RAW=$WORK/raw.tsv
# One round of one proxy: wrk, ab and the cold key; a row of RAW.
round() {
    local r=$1 p=$2 port=${PORT[$2]} t0 t1 b0 b1 wrk_rps ab_rps ab_failed cold
    b0=$(backend_count)
    # shellcheck disable=SC2046
    t0=$(cpu_ticks $(proc_tree "${PID_OF[$p]}"))
    taskset -c 1 wrk -t1 -c64 -d"${DURATION}s" "http://127.0.0.1:$port/hot-wrk" >"$WORK/wrk-$r-$p.txt" 2>&1
    # shellcheck disable=SC2046
    t1=$(cpu_ticks $(proc_tree "${PID_OF[$p]}"))
    b1=$(backend_count)
    wrk_rps=$(awk '/^Requests\/sec:/ {print $2}' "$WORK/wrk-$r-$p.txt")
    local wrk_n cpu_us be_wrk
    wrk_n=$(awk '/requests in/ {print $1}' "$WORK/wrk-$r-$p.txt")
    cpu_us=$(awk -v d=$((t1 - t0)) -v u="$TICK_US" -v n="$wrk_n" 'BEGIN {printf "%.2f", d * u / n}')
    be_wrk=$(awk -v d=$((b1 - b0)) -v s="$DURATION" 'BEGIN {printf "%.1f", d / s}')
    b0=$(backend_count)
    taskset -c 1 ab -q -k -r -s 30 -c 1000 -t "$DURATION" -n $((DURATION * 200000)) \
        "http://127.0.0.1:$port/hot-ab" >"$WORK/ab-$r-$p.txt" 2>&1 || true
    b1=$(backend_count)
    ab_rps=$(awk '/^Requests per second:/ {print $4}' "$WORK/ab-$r-$p.txt")
    ab_failed=$(awk '/^Failed requests:/ {f += $3} /^Non-2xx responses:/ {f += $3} END {print f + 0}' "$WORK/ab-$r-$p.txt")
    local be_ab
    be_ab=$(awk -v d=$((b1 - b0)) -v s="$DURATION" 'BEGIN {printf "%.1f", d / s}')
    b0=$(backend_count)
    taskset -c 1 ab -q -r -c 500 -n 500 "http://127.0.0.1:$port/cold-$r-$p" >"$WORK/cold-$r-$p.txt" 2>&1 || true
    b1=$(backend_count)
    cold=$((b1 - b0))
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$p" "${wrk_rps:-0}" "$cpu_us" "$be_wrk" \
        "${ab_rps:-0}" "$ab_failed" "$be_ab" "$cold" >>"$RAW"
    log "round $r $p: wrk ${wrk_rps} req/s (${cpu_us} us CPU/req, backends ${be_wrk}/s); ab -c1000 ${ab_rps} req/s, ${ab_failed} failed (backends ${be_ab}/s); 500 cold -> ${cold} at the backends"
}

for r in $(seq 1 "$ROUNDS"); do
    for p in pinlb nginx; do
        round "$r" "$p"
    done
done

# The memory run: distinct 64 KiB responses through pinlb's cache, RSS sampled.
MEM_LINE=""
if [[ $MEM == 1 ]]; then
    cat >"$WORK/distinct.lua" <<'LUA'
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/big/" .. n .. "-" .. math.random(1, 1000000000))
end
LUA
    rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/${PID_OF[pinlb]}/status"; }
    rss0=$(rss_kib)
    peak=$rss0
    passed=0
    deadline=$((SECONDS + 600))
    while ((passed < MEM_BYTES && SECONDS < deadline)); do
        taskset -c 1 wrk -t1 -c8 -d5s -s "$WORK/distinct.lua" "http://127.0.0.1:${PORT[pinlb]}/" >"$WORK/mem.txt" 2>&1 &
        WRK_PID=$!
        while kill -0 "$WRK_PID" 2>/dev/null; do
            now=$(rss_kib)
            ((now > peak)) && peak=$now
            sleep 0.5
        done
        wait "$WRK_PID" || true
        WRK_PID=""
        n=$(awk '/requests in/ {print $1}' "$WORK/mem.txt")
        passed=$((passed + ${n:-0} * 65536))
    done
    now=$(rss_kib)
    ((now > peak)) && peak=$now
    MEM_LINE="Memory run: $((passed / 1048576)) MiB of distinct 64 KiB responses through pinlb's cache (max_size 64 MiB): RSS ${rss0} KiB before, peak ${peak} KiB, $((now)) KiB after: peak growth $(((peak - rss0) / 1024)) MiB."
    log "$MEM_LINE"
fi

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
col() { awk -F'\t' -v p="$1" -v c="$2" '$2 == p {print $c}' "$RAW" | median; }
MD=$WORK/report.md
{
    echo "### Micro-cache: pinlb \`cache\` vs nginx \`proxy_cache\` + \`proxy_cache_lock\`, $(date -u +%F)"
    echo
    echo "\`$CMDLINE\` (ROUNDS=$ROUNDS DURATION=$DURATION BUSY_LOOP=$BUSY_LOOP): proxy on core 0, one worker; three Node.js"
    echo "backends answering \`Cache-Control: max-age=1\` and the load generator on core 1. Medians of $ROUNDS interleaved rounds."
    echo
    echo "| proxy | wrk -c64 req/s | CPU µs/req | backend req/s | ab -c1000 req/s | failed | backend req/s | 500 cold → backend |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    for p in pinlb nginx; do
        echo "| $p | $(col "$p" 3) | $(col "$p" 4) | $(col "$p" 5) | $(col "$p" 6) | $(col "$p" 7) | $(col "$p" 8) | $(col "$p" 9) |"
    done
    echo
    awk -v a="$(col pinlb 3)" -v b="$(col nginx 3)" -v c="$(col pinlb 6)" -v d="$(col nginx 6)" \
        -v e="$(col pinlb 4)" -v f="$(col nginx 4)" \
        'BEGIN {printf "pinlb / nginx: wrk %.2fx req/s at %.2fx CPU per request; ab -c1000 %.2fx req/s\n", a / b, e / f, c / d}'
    [[ -z $MEM_LINE ]] || {
        echo
        echo "$MEM_LINE"
    }
    raw_section "Per round (round, proxy, wrk req/s, CPU us/req, backend/s, ab req/s, failed, backend/s, cold):"
} >"$MD"
publish_report "$MD"
