#!/usr/bin/env bash
# benches/buffered_memory.sh - memory per buffered request, pinlb beside nginx, each with its
# buffering defaults (issue 53, item 2).
#
# One proxy at a time, ONE worker pinned to core 0, in front of a backend nginx (core 1)
# serving a file of BIG bytes:
#   nginx   proxy_request_buffering and proxy_buffering on (its defaults): client_body_buffer_size
#           16k, proxy_buffers 8 4k + proxy_buffer_size 4k, the rest to temporary files
#   pinlb   [upstream.app.buffering] with its defaults: memory = "64KiB" per request and
#           direction, the rest to a temporary file
# Two cases, CLIENTS connections at once (a Python client on core 1):
#   upload    each sends the head of a POST of SIZE bytes and half its body, then waits: the
#             proxy holds the half-read body (memory, then its temporary file)
#   download  each asks for the file with a 4 KiB receive buffer and reads nothing: the proxy
#             drains the backend's answer (memory, then its temporary file)
# Measured: the proxy's anonymous memory (Pss_Anon + Pss_Shmem of all its processes, so that
# nginx's master and worker are counted once) before, and once the clients are all in place and
# the figure has settled (two reads 0.5 s apart within 1%, at most 20 s); the difference over
# CLIENTS is the memory per buffered request. Socket buffers are the kernel's, the same for
# both, and not in this figure.
#
# Usage: bash benches/buffered_memory.sh [PINLB_BINARY]   (default target/release/pinlb)
#   CLIENTS=200, SIZE=1048576, BIG=8388608 (more than the sockets hold), ROUNDS=2, MEMORY=
#   (pinlb's buffering.memory; empty: its default, 64KiB), PORT_BASE=18330, KEEP_TMP=1 keeps the temp
#   dir, OUT_MD=/tmp/pinlb-buffered-memory.md
# Needs: nginx, curl, python3, taskset.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLB=${1:-$ROOT/target/release/pinlb}
CLIENTS=${CLIENTS:-200}
SIZE=${SIZE:-1048576}
BIG=${BIG:-8388608}
MEMORY=${MEMORY:-}
ROUNDS=${ROUNDS:-2}
KEEP_TMP=${KEEP_TMP:-0}
OUT_MD=${OUT_MD:-/tmp/pinlb-buffered-memory.md}
WORK=$(mktemp -d)
PIDS=()
log() { printf '[buffered-memory] %s\n' "$*" >&2; }
die() { printf '[buffered-memory] ERROR: %s\n' "$*" >&2; exit 1; }
PORT_BASE=${PORT_BASE:-18330}
NEXT_PORT=$PORT_BASE
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
running_pids() { echo "${PIDS[@]}"; }
install_cleanup
require nginx curl python3 taskset
[[ -x $PINLB ]] || die "no pinlb binary at $PINLB (cargo build --release, or pass its path)"
ulimit -n 20000 || die "needs an open-file limit of 20000 (ulimit -n)"

declare -A PORT PID_OF
pick_port
BACKEND_PORT=$PICKED
pick_port
PORT[pinlb]=$PICKED
pick_port
PORT[nginx]=$PICKED

mkdir -p "$WORK/nginx" "$WORK/spool"
nginx_temp_paths "$WORK/nginx"
cat >"$WORK/nginx/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 1;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 8192; }
http {
    include $WORK/nginx/temp_paths.conf;
    access_log off;
    client_max_body_size 64m;
    upstream app {
        server 127.0.0.1:$BACKEND_PORT;
        keepalive 64;
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

[limits]
max_body = "64MiB"
max_connections = 10000

[[listener]]
address = "127.0.0.1:${PORT[pinlb]}"
upstream = "app"

[upstream.app]
keepalive = 64
backends = [{ address = "127.0.0.1:$BACKEND_PORT" }]

[upstream.app.buffering]
temp_dir = "$WORK/spool"
EOF
[[ -z $MEMORY ]] || echo "memory = \"$MEMORY\"" >>"$WORK/pinlb.toml"

start_json_backend "$BACKEND_PORT" 1000
head -c "$BIG" /dev/zero | tr '\0' 'x' >"$WORK/www/big.bin"
chmod a+r "$WORK/www/big.bin"
"$PINLB" check -c "$WORK/pinlb.toml" >"$WORK/check.log" 2>&1 || die "pinlb check: $(cat "$WORK/check.log")"
# start P: proxy P, fresh (an allocator keeps what it once held, so every case starts anew).
start() {
    if [[ $1 == nginx ]]; then
        taskset -c 0 nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >"$WORK/nginx/out.log" 2>&1 &
        PID_OF[nginx]=$!
        wait_ready nginx "${PORT[nginx]}" "$!" "$WORK/nginx/error.log"
    else
        RUST_LOG=warn taskset -c 0 "$PINLB" serve -c "$WORK/pinlb.toml" >"$WORK/pinlb.log" 2>&1 &
        PID_OF[pinlb]=$!
        wait_ready pinlb "${PORT[pinlb]}" "$!" "$WORK/pinlb.log"
    fi
    PIDS+=("${PID_OF[$1]}")
}
# stop P: proxy P stopped and gone.
stop() {
    stop_all "${PID_OF[$1]}"
    wait "${PID_OF[$1]}" 2>/dev/null || true
}

# The clients: CLIENTS connections put in place, "ready" once they all are, then held until
# stdin closes.
cat >"$WORK/client.py" <<'PY'
import asyncio, socket, sys
mode, port, clients, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
async def one():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    r, w = await asyncio.open_connection(sock=s)
    if mode == "upload":
        w.write(b"POST /upload HTTP/1.1\r\nHost: app\r\nContent-Length: %d\r\n\r\n" % size)
        w.write(b"u" * (size // 2))
    else:
        w.write(b"GET /big.bin HTTP/1.1\r\nHost: app\r\n\r\n")
    await w.drain()
    return w
async def main():
    held = [await one() for _ in range(clients)]
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for w in held:
        w.close()
asyncio.run(main())
PY

# anon_kib PID...: Pss_Anon + Pss_Shmem of the processes, in KiB.
anon_kib() {
    local n=0 p
    for p in "$@"; do
        n=$((n + $(awk '/^Pss_(Anon|Shmem):/ {k += $2} END {print k + 0}' \
            "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)))
    done
    echo "$n"
}
# settled PEER: the proxy's anon KiB once two reads 0.5 s apart are within 1% (at most 20 s).
settled() {
    local a b i
    # shellcheck disable=SC2046 # the pids, one word each
    a=$(anon_kib $(proc_tree "${PID_OF[$1]}"))
    for ((i = 0; i < 40; i++)); do
        sleep 0.5
        # shellcheck disable=SC2046
        b=$(anon_kib $(proc_tree "${PID_OF[$1]}"))
        if ((b - a < b / 100 && a - b < b / 100)); then
            break
        fi
        a=$b
    done
    echo "$b"
}

RAW="$WORK/raw.tsv"
: >"$RAW"
for ((r = 1; r <= ROUNDS; r++)); do
    for mode in upload download; do
        for p in pinlb nginx; do
            start "$p"
            before=$(settled "$p")
            coproc HOLD { taskset -c 1 python3 "$WORK/client.py" "$mode" "${PORT[$p]}" "$CLIENTS" "$SIZE"; }
            # shellcheck disable=SC2153 # HOLD_PID is set by coproc
            hold_pid=$HOLD_PID
            hold_in=${HOLD[1]}
            read -r -t 60 ready <&"${HOLD[0]}" || die "$mode clients through $p not in place within 60 s"
            [[ $ready == ready ]] || die "$mode clients through $p: $ready"
            during=$(settled "$p")
            # shellcheck disable=SC2046
            spooled=$(find $(proc_tree "${PID_OF[$p]}" | sed 's|^|/proc/|; s|$|/fd|') \
                \( -lname "$WORK/spool/*" -o -lname "$WORK/nginx/tmp/*" \) 2>/dev/null | wc -l)
            exec {hold_in}>&- # the clients' stdin closes: they let go
            wait "$hold_pid" || true
            stop "$p"
            per=$(awk -v a="$before" -v b="$during" -v n="$CLIENTS" 'BEGIN { printf "%.1f", (b - a) / n }')
            printf '%d\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$mode" "$p" "$before" "$during" "$per" "$spooled" >>"$RAW"
            log "round $r $mode $p: anon $before -> $during KiB, $per KiB per request, $spooled temporary files open"
        done
    done
done

MD="$WORK/report.md"
{
    echo "## Memory per buffered request: $CLIENTS at once, nginx with its buffering defaults, pinlb with memory = \"${MEMORY:-64KiB (its default)}\""
    echo
    echo "upload: a POST of $SIZE bytes, half its body sent; download: $BIG bytes asked for and not read."
    echo "Anonymous memory (Pss_Anon + Pss_Shmem), one worker on core 0; median over $ROUNDS rounds."
    echo
    echo "| case | pinlb KiB per request | nginx KiB per request | pinlb / nginx |"
    echo "|---|---:|---:|---:|"
    for mode in upload download; do
        med_p=$(awk -F'\t' -v m="$mode" '$2 == m && $3 == "pinlb" {print $6}' "$RAW" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
        med_n=$(awk -F'\t' -v m="$mode" '$2 == m && $3 == "nginx" {print $6}' "$RAW" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
        awk -v m="$mode" -v a="$med_p" -v b="$med_n" 'BEGIN { printf "| %s | %.1f | %.1f | %.2f |\n", m, a, b, (b > 0) ? a / b : 0 }'
    done
    raw_section "Per round (round, case, proxy, anon KiB before, during, KiB per request, temporary files open):"
} >"$MD"
publish_report "$MD"
