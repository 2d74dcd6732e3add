#!/usr/bin/env bash
# benches/slowhead.sh - CPU a proxy spends on a request head that arrives one byte per packet
# (a slowloris client's way), pinlb against nginx in the same run, interleaved rounds.
#
# Topology (2 cores): core 0 runs the proxy under test (one worker); core 1 runs the backend
# nginx (`return 200`) and the client. The client (python3, TCP_NODELAY) sends a HEAD_BYTES
# request head of LINE-byte header lines (default 308: 98 lines, so that with Host and
# the last one the head has 100 header lines, pinlb's default max_headers), one byte per send() with a short pause between sends so
# that each byte is a packet and a read of its own, then reads the response. The proxy's CPU
# time is the sum of /proc/PID/task/*/schedstat (nanoseconds on CPU) over its processes, read
# before and after the request. The head stays under both proxies' defaults (nginx: 4 buffers
# of 8 KiB, lines under 8 KiB; pinlb: limits.max_header_bytes 32 KiB) and well inside
# limits.header_timeout (nginx: client_header_timeout 60 s).
#
# Usage: bash benches/slowhead.sh
#   PINLBS="name=binary ..."  pinlb builds to compare (default: pinlb=target/release/pinlb), e.g.
#                             PINLBS="before=/tmp/pinlb-old after=target/release/pinlb"
#   ROUNDS=3 HEAD_BYTES=30310 LINE=308 GAP_US=50 KEEP_TMP=0
# Needs: nginx, python3, curl, taskset.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLBS=${PINLBS:-pinlb=$ROOT/target/release/pinlb}
ROUNDS=${ROUNDS:-3}
HEAD_BYTES=${HEAD_BYTES:-30310}
GAP_US=${GAP_US:-50}
LINE=${LINE:-308}
BACKEND_PORT=${BACKEND_PORT:-18280}
WORK=$(mktemp -d)
KEEP_TMP=${KEEP_TMP:-0}
PIDS=()
log() { printf '[slowhead] %s\n' "$*" >&2; }
die() { printf '[slowhead] ERROR: %s\n' "$*" >&2; exit 1; }
PORT_BASE=$BACKEND_PORT
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
running_pids() { echo "${PIDS[@]}"; }
install_cleanup

# Nanoseconds on CPU of a process and its children, every thread.
cpu_ns() {
    local total=0 pid t
    for pid in "$1" $(ps -o pid= --ppid "$1" 2>/dev/null); do
        for t in /proc/"$pid"/task/*/schedstat; do
            total=$((total + $(cut -d' ' -f1 "$t" 2>/dev/null || echo 0)))
        done
    done
    echo "$total"
}

render() { # TEMPLATE DEST PORT DIR
    sed -e "s|@DIR@|$4|g" -e "s|@PORT@|$3|g" -e "s|@BACKEND_PORT@|$BACKEND_PORT|g" "$1" >"$2"
}
mkdir -p "$WORK/backend"
nginx_temp_paths "$WORK/backend"
render "$ROOT/benches/peers/backend-nginx.conf" "$WORK/backend/nginx.conf" "" "$WORK/backend"
taskset -c 1 nginx -p "$WORK/backend" -c "$WORK/backend/nginx.conf" -e "$WORK/backend/error.log" &
PIDS+=($!)
wait_ready backend "$BACKEND_PORT" "$!" "$WORK/backend/error.log"

NAMES=()
declare -A PORT PID
port=$((BACKEND_PORT + 1))
for spec in $PINLBS; do
    name=${spec%%=*}
    bin=${spec#*=}
    mkdir -p "$WORK/$name"
    render "$ROOT/benches/peers/pinlb.toml" "$WORK/$name/pinlb.toml" "$port" "$WORK/$name"
    RUST_LOG=warn taskset -c 0 "$bin" serve -c "$WORK/$name/pinlb.toml" 2>"$WORK/$name/log" &
    PID[$name]=$!
    PIDS+=($!)
    PORT[$name]=$port
    NAMES+=("$name")
    wait_ready "$name" "$port" "${PID[$name]}" "$WORK/$name/log"
    port=$((port + 1))
done
mkdir -p "$WORK/nginx"
nginx_temp_paths "$WORK/nginx"
render "$ROOT/benches/peers/nginx.conf" "$WORK/nginx/nginx.conf" "$port" "$WORK/nginx"
taskset -c 0 nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/error.log" &
PID[nginx]=$!
PIDS+=($!)
PORT[nginx]=$port
NAMES+=(nginx)
wait_ready nginx "$port" "${PID[nginx]}" "$WORK/nginx/error.log"

cat >"$WORK/client.py" <<'EOF'
import socket, sys, time
port, size, gap, width = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) / 1e6, int(sys.argv[4])
head = b"GET / HTTP/1.1\r\nHost: bench\r\n"
n = 0
while len(head) + width + 13 <= size:
    line = b"X-Pad-%05d: " % n
    head += line + b"a" * (width - 2 - len(line)) + b"\r\n"
    n += 1
head += b"X-End: " + b"b" * max(0, size - len(head) - 11) + b"\r\n\r\n"
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for i in range(len(head)):
    s.send(head[i:i + 1])
    if gap:
        time.sleep(gap)
resp = s.recv(65536)
status = resp.split(b" ", 2)[1].decode() if resp else "none"
print(len(head), status)
EOF

echo "head: $HEAD_BYTES bytes in $LINE-byte lines, one byte per packet; proxy on core 0; $ROUNDS rounds"
declare -A RESULTS
for round in $(seq "$ROUNDS"); do
    for name in "${NAMES[@]}"; do
        before=$(cpu_ns "${PID[$name]}")
        out=$(taskset -c 1 python3 "$WORK/client.py" "${PORT[$name]}" "$HEAD_BYTES" "$GAP_US" "$LINE")
        after=$(cpu_ns "${PID[$name]}")
        ms=$(awk -v d=$((after - before)) 'BEGIN{printf "%.1f", d / 1e6}')
        echo "round $round  $name  head ${out% *} bytes  status ${out#* }  CPU ${ms} ms"
        RESULTS[$name]="${RESULTS[$name]:-} $ms"
    done
done
echo
echo "median CPU per head (ms):"
for name in "${NAMES[@]}"; do
    # shellcheck disable=SC2086
    med=$(printf '%s\n' ${RESULTS[$name]} | sort -n | awk '{a[NR]=$1} END{print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
    echo "  $name: $med"
done
