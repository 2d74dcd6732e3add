#!/usr/bin/env bash
# benches/compression.sh - gzip through pinlb against gzip through nginx at the same level, in
# one run, on the same backend (issue 30's compression bar).
#
# A JSON document of DOC_BYTES (default 100 KiB; records of ids, names, e-mails, numbers, tags:
# real JSON, not one repeated byte, benches/peers/json_doc.py), served as application/json with
# its Content-Length by a backend nginx (core 1). The proxies under test, each ONE worker pinned to core 0, in turn:
#   nginx   gzip on; gzip_comp_level $LEVEL; gzip_types application/json; (gzip_proxied any)
#   pinlb   compress = { algorithms = ["gzip"], gzip_level = $LEVEL, types = ["application/json"] }
# Both keep up to 64 keep-alive connections to the backend. The load (wrk -t1 on core 1,
# `Accept-Encoding: gzip`) runs $ROUNDS interleaved rounds: pinlb, nginx, pinlb, nginx, ...
#
# Measured:
#   size         the compressed body's bytes through each (curl, once); pinlb's against nginx's
#                (the bar: within 2%), and pinlb's br and zstd sizes beside them
#   req/s        wrk's Requests/sec, median over the rounds
#   CPU us/req   utime+stime of all the proxy's processes over the recorded run, divided by the
#                requests wrk completed, median over the rounds (the bar: pinlb's <= nginx's)
#   RSS, PSS MB  the proxy's resident memory (all its processes) halfway through each recorded
#                run, median over the rounds: RSS counts pages shared between its processes once
#                per process (nginx's master and worker share most of theirs), PSS shares them out
#   anon MB      the anonymous and shared-memory part of PSS (Pss_Anon + Pss_Shmem): heap,
#                stacks, shared zones, what grows with load; the rest of PSS is the programs' and
#                libraries' files (code, read-only data), whose size is the binary's
# CODING=br or zstd runs pinlb alone with that coding (nginx has neither here).
# Memory per compressing stream is the encoder's state: stated in docs/behaviour.md
# ("Compression") and checked by `cargo test -p pinlb-proxy --lib modules::compress::encoder::tests::memory_per_stream`.
#
# Usage: bash benches/compression.sh [PINLB_BINARY]   (default target/release/pinlb)
#   ROUNDS=5, DURATION=10s, WARMUP=1s, CONNS=16, LEVEL=1, DOC_BYTES=102400 (3400 gives the
#   3,314-byte document of issue 53's runs), CODING=gzip, KEEP_TMP=1 keeps the temp dir,
#   PORT_BASE=18330, OUT_MD=/tmp/pinlb-compression.md
# Needs: nginx, wrk, curl, python3, taskset.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLB=${1:-$ROOT/target/release/pinlb}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-1s}
CONNS=${CONNS:-16}
LEVEL=${LEVEL:-1}
DOC_BYTES_WANTED=${DOC_BYTES:-102400}
KEEP_TMP=${KEEP_TMP:-0}
OUT_MD=${OUT_MD:-/tmp/pinlb-compression.md}
PORT_BASE=${PORT_BASE:-18330}
WORK=$(mktemp -d)
PIDS=()
WRK_PID=""
log() { printf '[compression] %s\n' "$*" >&2; }
die() { printf '[compression] ERROR: %s\n' "$*" >&2; exit 1; }
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
running_pids() { echo "${PIDS[@]}" ${WRK_PID:+"$WRK_PID"}; }
install_cleanup
require nginx wrk curl python3 taskset
[[ -x $PINLB ]] || die "no pinlb binary at $PINLB (cargo build --release, or pass its path)"

# ---------------------------------------------------------------- configs
declare -A PORT PID_OF
pick_port
BACKEND_PORT=$PICKED
pick_port
PORT[pinlb]=$PICKED
pick_port
PORT[nginx]=$PICKED

mkdir -p "$WORK/nginx"
nginx_temp_paths "$WORK/nginx"
cat >"$WORK/nginx/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 1;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 4096; }
http {
    include $WORK/nginx/temp_paths.conf;
    access_log off;
    server_tokens off;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    gzip on;
    gzip_comp_level $LEVEL;
    gzip_types application/json;
    gzip_proxied any;
    upstream app {
        server 127.0.0.1:$BACKEND_PORT;
        keepalive 64;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:${PORT[nginx]} backlog=4096;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
cat >"$WORK/pinlb.toml" <<EOF
[runtime]
cpus = [0]

[[listener]]
address = "127.0.0.1:${PORT[pinlb]}"
upstream = "app"
compress = { algorithms = ["gzip", "br", "zstd"], gzip_level = $LEVEL, types = ["application/json"] }

[upstream.app]
keepalive = 64
backends = [{ address = "127.0.0.1:$BACKEND_PORT" }]
EOF

# ---------------------------------------------------------------- start
read -r IDLE_BUSY0 IDLE_BUSY1 < <(core_busy_1s)
start_json_backend "$BACKEND_PORT" "$DOC_BYTES_WANTED"
DOC_BYTES=$(wc -c <"$WORK/www/data.json")
taskset -c 0 nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >"$WORK/nginx/out.log" 2>&1 &
PID_OF[nginx]=$!
PIDS+=($!)
wait_ready nginx "${PORT[nginx]}" "${PID_OF[nginx]}" "$WORK/nginx/error.log"
"$PINLB" check -c "$WORK/pinlb.toml" >"$WORK/check.log" 2>&1 || die "pinlb check: $(cat "$WORK/check.log")"
RUST_LOG=warn taskset -c 0 "$PINLB" serve -c "$WORK/pinlb.toml" >"$WORK/pinlb.log" 2>&1 &
PID_OF[pinlb]=$!
PIDS+=($!)
wait_ready pinlb "${PORT[pinlb]}" "${PID_OF[pinlb]}" "$WORK/pinlb.log"

# ---------------------------------------------------------------- sizes
# size PEER CODING: the body's bytes as sent; checks that curl (with its zlib, brotli and zstd)
# decodes the same coding back to the document.
size() {
    local out="$WORK/$1.$2" url="http://127.0.0.1:${PORT[$1]}/data.json"
    curl -s --max-time 10 -H "Accept-Encoding: $2" -D "$out.head" -o "$out" "$url" ||
        die "curl through $1 failed"
    grep -qi "^content-encoding: $2" "$out.head" || die "$1 did not answer with $2: $(cat "$out.head")"
    curl -s --max-time 10 --compressed -H "Accept-Encoding: $2" -o "$out.plain" "$url" ||
        die "curl --compressed through $1 failed"
    cmp -s "$out.plain" "$WORK/www/data.json" || die "$1's $2 body does not decode to the document"
    wc -c <"$out"
}
SIZE_NGINX=$(size nginx gzip)
SIZE_PINLB=$(size pinlb gzip)
SIZE_BR=$(size pinlb br)
SIZE_ZSTD=$(size pinlb zstd)

# ---------------------------------------------------------------- rounds
RAW="$WORK/raw.tsv"
: >"$RAW"
TCK=$(getconf CLK_TCK)
CODING=${CODING:-gzip}
PEERS=(pinlb nginx)
[[ $CODING == gzip ]] || PEERS=(pinlb)
# rss_mb PID...: resident memory of the processes, in MB: "RSS PSS ANON", RSS counting the
# pages they share (nginx's master and worker share most of theirs) once per process, PSS
# sharing them out, ANON the anonymous and shared-memory part of PSS (/proc/PID/smaps_rollup).
rss_mb() {
    local rss=0 pss=0 anon=0 p
    for p in "$@"; do
        rss=$((rss + $(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)))
        pss=$((pss + $(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)))
        anon=$((anon + $(awk '/^Pss_(Anon|Shmem):/ {n += $2} END {print n + 0}' \
            "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)))
    done
    awk -v r="$rss" -v s="$pss" -v a="$anon" \
        'BEGIN { printf "%.1f\t%.1f\t%.1f\n", r / 1024, s / 1024, a / 1024 }'
}
# wrk_run PEER DURATION OUT [RSS_OUT]: with RSS_OUT, the proxy's RSS halfway through goes there.
wrk_run() {
    taskset -c 1 wrk -t1 -c"$CONNS" -d"$2" -H "Accept-Encoding: $CODING" \
        "http://127.0.0.1:${PORT[$1]}/data.json" >"$3" 2>&1 &
    WRK_PID=$!
    if [[ -n ${4:-} ]]; then
        sleep "$(awk -v d="${2%s}" 'BEGIN { print d / 2 }')"
        # shellcheck disable=SC2046 # the pids, one word each
        rss_mb $(proc_tree "${PID_OF[$1]}") >"$4"
    fi
    wait_wrk "$3"
}
for ((r = 1; r <= ROUNDS; r++)); do
    for p in "${PEERS[@]}"; do
        [[ $WARMUP == 0 || $WARMUP == 0s ]] || wrk_run "$p" "$WARMUP" "$WORK/warm.out"
        # shellcheck disable=SC2046 # the pids, one word each
        t0=$(cpu_ticks $(proc_tree "${PID_OF[$p]}"))
        wrk_run "$p" "$DURATION" "$WORK/$p.$r.out" "$WORK/$p.$r.rss"
        # shellcheck disable=SC2046
        t1=$(cpu_ticks $(proc_tree "${PID_OF[$p]}"))
        IFS=$'\t' read -r rss pss anon <"$WORK/$p.$r.rss"
        rps=$(awk '/^Requests\/sec:/ {print $2}' "$WORK/$p.$r.out")
        reqs=$(awk '/requests in/ {print $1}' "$WORK/$p.$r.out")
        non2xx=$(awk '/Non-2xx/ {print $NF}' "$WORK/$p.$r.out")
        [[ -z $non2xx ]] || die "$p answered $non2xx non-2xx responses: $(cat "$WORK/$p.$r.out")"
        us=$(awk -v t=$((t1 - t0)) -v k="$TCK" -v n="$reqs" 'BEGIN { printf "%.1f", (n > 0) ? t / k * 1e6 / n : 0 }')
        printf '%d\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$p" "$rps" "$us" "$rss" "$pss" "$anon" >>"$RAW"
        log "round $r $p: $rps req/s, $us us CPU/req, RSS $rss MB, PSS $pss MB, anon $anon MB"
    done
done

# ---------------------------------------------------------------- report
MD="$WORK/report.md"
read -r RPS_P _ _ < <(stats pinlb 3)
read -r RPS_N _ _ < <(stats nginx 3)
read -r CPU_P _ _ < <(stats pinlb 4)
read -r CPU_N _ _ < <(stats nginx 4)
read -r RSS_P _ _ < <(stats pinlb 5)
read -r RSS_N _ _ < <(stats nginx 5)
read -r PSS_P _ _ < <(stats pinlb 6)
read -r PSS_N _ _ < <(stats nginx 6)
read -r ANON_P _ _ < <(stats pinlb 7)
read -r ANON_N _ _ < <(stats nginx 7)
{
    echo "## Compression: a ${DOC_BYTES}-byte JSON document, $CODING, gzip level $LEVEL"
    echo
    echo "$ROUNDS rounds of $DURATION, wrk -t1 -c$CONNS on core 1 (Accept-Encoding: $CODING), proxies on core 0, backend nginx on core 1."
    echo
    echo "| | pinlb | nginx | pinlb / nginx |"
    echo "|---|---|---|---|"
    awk -v a="$SIZE_PINLB" -v b="$SIZE_NGINX" 'BEGIN { printf "| gzip bytes | %d | %d | %.3f (bar: within 2%%) |\n", a, b, a / b }'
    if [[ $CODING == gzip ]]; then
        awk -v a="$RPS_P" -v b="$RPS_N" 'BEGIN { printf "| req/s (median) | %.0f | %.0f | %.2f |\n", a, b, a / b }'
        awk -v a="$CPU_P" -v b="$CPU_N" 'BEGIN { printf "| CPU us/req (median) | %.1f | %.1f | %.2f |\n", a, b, a / b }'
        awk -v a="$RSS_P" -v b="$RSS_N" 'BEGIN { printf "| RSS MB while serving (median) | %.1f | %.1f | %.2f |\n", a, b, a / b }'
        awk -v a="$PSS_P" -v b="$PSS_N" 'BEGIN { printf "| PSS MB while serving (median) | %.1f | %.1f | %.2f |\n", a, b, a / b }'
        awk -v a="$ANON_P" -v b="$ANON_N" 'BEGIN { printf "| anon MB of it: heap, stacks, shared zones (median) | %.1f | %.1f | %.2f |\n", a, b, a / b }'
    else
        echo "| $CODING req/s (median) | $RPS_P | – | – |"
        echo "| $CODING CPU us/req (median) | $CPU_P | – | – |"
        echo "| $CODING RSS MB while serving (median) | $RSS_P | – | – |"
        echo "| $CODING PSS MB while serving (median) | $PSS_P | – | – |"
        echo "| $CODING anon MB of it (median) | $ANON_P | – | – |"
    fi
    echo
    echo "pinlb's other codings of the same document: br (level 4) $SIZE_BR bytes, zstd (level 3) $SIZE_ZSTD bytes."
    echo "Memory per compressing stream: docs/behaviour.md, \"Compression\"."
    raw_section "Per round (round, proxy, req/s, CPU us/req, RSS MB, PSS MB, anon MB):"
} >"$MD"
publish_report "$MD"
