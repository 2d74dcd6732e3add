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
# before and after the request, with the user/system split (utime, stime) and the context
# switches beside it. The head stays under both proxies' defaults (nginx: 4 buffers
# of 8 KiB, lines under 8 KiB; pinlb: limits.max_header_bytes 32 KiB) and well inside
# limits.header_timeout (nginx: client_header_timeout 60 s).
#
# Usage: bash benches/slowhead.sh
#   PINLBS="name=binary ..."  pinlb builds to compare (default: pinlb=target/release/pinlb), e.g.
#                             PINLBS="before=/tmp/pinlb-old after=target/release/pinlb"
#   ROUNDS=3 HEAD_BYTES=30310 LINE=308 GAP_US=50 KEEP_TMP=0
#   BACKEND_PORT=18280        ports: the first free loopback ports from here on
#   CALLGRIND=1               run every proxy under valgrind's callgrind (nginx without its master
#                             process) and report user-space instructions per head and per wakeup
#                             (per epoll_wait call) beside the CPU, which valgrind inflates. Use a
#                             shorter head and a longer pause so that each byte is still a read of
#                             its own under valgrind's slowdown: HEAD_BYTES=1500 GAP_US=4000
#                             (6 s, inside pinlb's limits.header_timeout of 10 s).
# Needs: nginx, python3, curl, taskset; valgrind for CALLGRIND=1.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLBS=${PINLBS:-pinlb=$ROOT/target/release/pinlb}
ROUNDS=${ROUNDS:-3}
HEAD_BYTES=${HEAD_BYTES:-30310}
GAP_US=${GAP_US:-50}
LINE=${LINE:-308}
BACKEND_PORT=${BACKEND_PORT:-18280}
CALLGRIND=${CALLGRIND:-0}
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
VG=()
[ "$CALLGRIND" = 1 ] && VG=(valgrind --tool=callgrind)

# What a process and its children used so far, every thread: nanoseconds on CPU (schedstat),
# user and system clock ticks (stat's utime and stime: the kernel's split of that time, at tick
# resolution) and context switches (a switch is a wait for the next byte, then a wakeup).
usage() {
    local ns=0 user=0 sys=0 switches=0 pid t
    for pid in $(proc_tree "$1"); do
        for t in /proc/"$pid"/task/*; do
            ns=$((ns + $(cut -d' ' -f1 "$t/schedstat" 2>/dev/null || echo 0)))
            # Field 2 (comm) may hold spaces: after ") " utime and stime are $12 and $13.
            read -r u s < <(sed 's/^.*) //' "$t/stat" 2>/dev/null | awk '{print $12, $13}') || true
            user=$((user + ${u:-0}))
            sys=$((sys + ${s:-0}))
            switches=$((switches + $(awk '/ctxt_switches/{n += $2} END{print n + 0}' "$t/status" 2>/dev/null || echo 0)))
        done
    done
    echo "$ns $user $sys $switches"
}
HZ=$(getconf CLK_TCK)

render() { # TEMPLATE DEST PORT DIR
    sed -e "s|@DIR@|$4|g" -e "s|@PORT@|$3|g" -e "s|@BACKEND_PORT@|$BACKEND_PORT|g" "$1" >"$2"
}
# Free ports only: a port another run still holds would answer wait_ready for a server that
# failed to start.
pick_port
BACKEND_PORT=$PICKED
mkdir -p "$WORK/backend"
nginx_temp_paths "$WORK/backend"
render "$ROOT/benches/peers/backend-nginx.conf" "$WORK/backend/nginx.conf" "" "$WORK/backend"
taskset -c 1 nginx -p "$WORK/backend" -c "$WORK/backend/nginx.conf" -e "$WORK/backend/error.log" &
PIDS+=($!)
wait_ready backend "$BACKEND_PORT" "$!" "$WORK/backend/error.log"

# Under valgrind a proxy takes seconds to listen, more than wait_ready's 5 s on a busy machine:
# up to 60 s more for its port to be bound.
slow_start() {
    local i
    [ "$CALLGRIND" = 1 ] || return 0
    for ((i = 0; i < 600; i++)); do
        port_in_use "$1" && return 0
        sleep 0.1
    done
}

NAMES=()
declare -A PORT PID
for spec in $PINLBS; do
    name=${spec%%=*}
    bin=${spec#*=}
    mkdir -p "$WORK/$name"
    pick_port
    port=$PICKED
    render "$ROOT/benches/peers/pinlb.toml" "$WORK/$name/pinlb.toml" "$port" "$WORK/$name"
    RUST_LOG=warn taskset -c 0 "${VG[@]}" ${VG:+--callgrind-out-file="$WORK/$name/cg.out" --log-file="$WORK/$name/valgrind.log"} \
        "$bin" serve -c "$WORK/$name/pinlb.toml" 2>"$WORK/$name/log" &
    PID[$name]=$!
    PIDS+=($!)
    PORT[$name]=$port
    NAMES+=("$name")
    slow_start "$port"
    wait_ready "$name" "$port" "${PID[$name]}" "$WORK/$name/log"
done
mkdir -p "$WORK/nginx"
nginx_temp_paths "$WORK/nginx"
pick_port
port=$PICKED
render "$ROOT/benches/peers/nginx.conf" "$WORK/nginx/nginx.conf" "$port" "$WORK/nginx"
if [ "$CALLGRIND" = 1 ]; then
    # One process, the one valgrind runs: the worker's work is the master's then.
    sed -i 's/^master_process on;/master_process off;/' "$WORK/nginx/nginx.conf"
fi
taskset -c 0 "${VG[@]}" ${VG:+--callgrind-out-file="$WORK/nginx/cg.out" --log-file="$WORK/nginx/valgrind.log"} nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/error.log" &
PID[nginx]=$!
PIDS+=($!)
PORT[nginx]=$port
NAMES+=(nginx)
slow_start "$port"
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
# Calls of libc's epoll_wait in a callgrind dump (one per wakeup, for pinlb and nginx alike):
# the `calls=` lines under each `cfn=` naming it (callgrind names a function once, then by id).
epoll_waits() {
    awk '/^c?fn=\(/ {
            id = $1; sub(/^c?fn=/, "", id)
            if (NF > 1) name[id] = $2
            if ($1 ~ /^cfn=/) callee = name[id]
        }
        /^calls=/ { if (callee == "epoll_wait") { split($1, c, "="); n += c[2] } }
        END { print n + 0 }' "$1"
}
declare -A RESULTS USER SYS SWITCHES IR IR_WAKE DUMPS
for round in $(seq "$ROUNDS"); do
    for name in "${NAMES[@]}"; do
        [ "$CALLGRIND" = 1 ] && callgrind_control -z "${PID[$name]}" >/dev/null 2>&1
        read -r ns0 u0 s0 c0 < <(usage "${PID[$name]}")
        out=$(taskset -c 1 python3 "$WORK/client.py" "${PORT[$name]}" "$HEAD_BYTES" "$GAP_US" "$LINE")
        read -r ns1 u1 s1 c1 < <(usage "${PID[$name]}")
        ir=""
        if [ "$CALLGRIND" = 1 ]; then
            # The instructions since the zeroing: the round's dump of the counters.
            DUMPS[$name]=$((${DUMPS[$name]:-0} + 1))
            callgrind_control -d "${PID[$name]}" >/dev/null 2>&1
            dump="$WORK/$name/cg.out.${DUMPS[$name]}"
            n=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",", "", $1); print $1}')
            waits=$(epoll_waits "$dump")
            per=$((n / (waits > 0 ? waits : 1)))
            IR[$name]="${IR[$name]:-} $n"
            IR_WAKE[$name]="${IR_WAKE[$name]:-} $per"
            ir="  instructions $n, epoll_wait calls $waits ($per instructions per wait)"
        fi
        ms=$(awk -v d=$((ns1 - ns0)) 'BEGIN{printf "%.1f", d / 1e6}')
        user=$(((u1 - u0) * 1000 / HZ))
        sys=$(((s1 - s0) * 1000 / HZ))
        echo "round $round  $name  head ${out% *} bytes  status ${out#* }  CPU ${ms} ms (user ${user}, sys ${sys})  switches $((c1 - c0))$ir"
        RESULTS[$name]="${RESULTS[$name]:-} $ms"
        USER[$name]="${USER[$name]:-} $user"
        SYS[$name]="${SYS[$name]:-} $sys"
        SWITCHES[$name]="${SWITCHES[$name]:-} $((c1 - c0))"
    done
done
median() {
    printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END{print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'
}
echo
echo "median per head: CPU ms (user ms, sys ms; tick resolution $((1000 / HZ)) ms), context switches:"
for name in "${NAMES[@]}"; do
    # shellcheck disable=SC2086
    echo "  $name: $(median ${RESULTS[$name]}) (user $(median ${USER[$name]}), sys $(median ${SYS[$name]})), switches $(median ${SWITCHES[$name]})"
    if [ "$CALLGRIND" = 1 ]; then
        # shellcheck disable=SC2086
        echo "    user-space instructions per head $(median ${IR[$name]}), per epoll_wait $(median ${IR_WAKE[$name]})"
    fi
done
