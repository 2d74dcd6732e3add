#!/usr/bin/env bash
# benches/unix_socket.sh - the same backend over TCP and over a Unix socket, through pinlb, in one
# run (issue 30: users report 10-20% more req/s over sockets).
#
# Topology: pinlb with ONE worker on core 0 and two listeners, one to an upstream at
# 127.0.0.1:PORT and one to an upstream at unix:$WORK/app.sock. Behind them, two copies of the
# same Node.js HTTP server (`hello world\n`), one listening on each, both pinned to core 1, where
# wrk (-t1 -c$CONNS) runs too; only one of them is loaded at a time. Keep-alive on both sides.
#
# Procedure: everything starts once. For each of $ROUNDS rounds, tcp then unix (the order
# alternating every round), an unrecorded warm-up ($WARMUP) and the recorded wrk run
# ($DURATION). Per run: req/s (wrk), p99, and CPU per request (utime+stime from /proc/PID/stat)
# of pinlb and of the backend that served it. Printed: each round, then the medians and the unix
# / tcp ratios, as Markdown.
#
# Usage: bash benches/unix_socket.sh [PINLB_BINARY]   (default target/release/pinlb)
#   ROUNDS=5 DURATION=10s WARMUP=2s CONNS=32 PORT_BASE=18340 KEEP_TMP=1 keeps the temp dir.
# Needs: node, wrk, curl, taskset.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLB=${1:-$ROOT/target/release/pinlb}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
CONNS=${CONNS:-32}
KEEP_TMP=${KEEP_TMP:-0}
PORT_BASE=${PORT_BASE:-18340}
WORK=$(mktemp -d)
PIDS=()
WRK_PID=""
log() { printf '[unix_socket] %s\n' "$*" >&2; }
die() { printf '[unix_socket] ERROR: %s\n' "$*" >&2; exit 1; }
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
running_pids() { echo "${PIDS[@]}" "$WRK_PID"; }
install_cleanup
require node wrk curl taskset
[[ -x $PINLB ]] || die "no pinlb binary at $PINLB (cargo build --release)"
(($(nproc) >= 2)) || die "need at least 2 cores (0 and 1)"
CLK_TCK=$(getconf CLK_TCK)

cat >"$WORK/server.js" <<'JS'
const target = process.argv[2];
const server = require('http').createServer((req, res) => {
  res.writeHead(200, { 'content-type': 'text/plain', 'content-length': 12 });
  res.end('hello world\n');
});
server.keepAliveTimeout = 600000;
if (/^\d+$/.test(target)) server.listen(Number(target), '127.0.0.1');
else server.listen(target);
JS

pick_port
BACKEND_PORT=$PICKED
pick_port
TCP_LISTENER=$PICKED
pick_port
UNIX_LISTENER=$PICKED
SOCK=$WORK/app.sock

taskset -c 1 node "$WORK/server.js" "$BACKEND_PORT" >"$WORK/tcp-backend.log" 2>&1 &
TCP_BACKEND=$!
PIDS+=("$TCP_BACKEND")
taskset -c 1 node "$WORK/server.js" "$SOCK" >"$WORK/unix-backend.log" 2>&1 &
UNIX_BACKEND=$!
PIDS+=("$UNIX_BACKEND")
wait_ready tcp-backend "$BACKEND_PORT" "$TCP_BACKEND" "$WORK/tcp-backend.log"
for ((i = 0; i < 50; i++)); do
    [[ $(curl -s --max-time 1 --unix-socket "$SOCK" http://localhost/ 2>/dev/null) == "hello world" ]] && break
    kill -0 "$UNIX_BACKEND" 2>/dev/null || die "the unix-socket backend exited: $(cat "$WORK/unix-backend.log")"
    sleep 0.1
done
((i < 50)) || die "the unix-socket backend does not answer on $SOCK"

cat >"$WORK/pinlb.toml" <<EOF
[runtime]
cpus = [0]

[[listener]]
address = "127.0.0.1:$TCP_LISTENER"
upstream = "tcp"

[[listener]]
address = "127.0.0.1:$UNIX_LISTENER"
upstream = "unix"

[upstream.tcp]
keepalive = 64
backends = [{ address = "127.0.0.1:$BACKEND_PORT" }]

[upstream.unix]
keepalive = 64
backends = [{ address = "unix:$SOCK" }]
EOF
"$PINLB" serve -c "$WORK/pinlb.toml" 2>"$WORK/pinlb.log" &
PINLB_PID=$!
PIDS+=("$PINLB_PID")
wait_ready pinlb "$TCP_LISTENER" "$PINLB_PID" "$WORK/pinlb.log"
wait_ready pinlb "$UNIX_LISTENER" "$PINLB_PID" "$WORK/pinlb.log"

declare -A LISTENER=([tcp]=$TCP_LISTENER [unix]=$UNIX_LISTENER)
declare -A BACKEND=([tcp]=$TCP_BACKEND [unix]=$UNIX_BACKEND)
RAW="$WORK/raw.tsv" # round peer rps p99_us pinlb_us_per_req backend_us_per_req requests
: >"$RAW"
log "pinlb $("$PINLB" --version 2>/dev/null || echo '?'), node $(node --version); $ROUNDS rounds of $WARMUP + $DURATION, $CONNS connections"
for ((r = 1; r <= ROUNDS; r++)); do
    order=(tcp unix)
    ((r % 2 == 0)) && order=(unix tcp)
    for p in "${order[@]}"; do
        run_wrk "${LISTENER[$p]}" "$WARMUP" "$WORK/warm.txt"
        p0=$(cpu_ticks "$PINLB_PID")
        b0=$(cpu_ticks "${BACKEND[$p]}")
        run_wrk "${LISTENER[$p]}" "$DURATION" "$WORK/$p-$r.txt"
        p1=$(cpu_ticks "$PINLB_PID")
        b1=$(cpu_ticks "${BACKEND[$p]}")
        out="$WORK/$p-$r.txt"
        rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
        reqs=$(awk '/requests in/ {print $1}' "$out")
        p99=$(to_us "$(awk '$1 == "99%" {print $2}' "$out")")
        non2xx=$(awk '/Non-2xx/ {print $NF}' "$out")
        [[ -z $non2xx ]] || die "$p round $r: $non2xx non-2xx answers: $(cat "$out")"
        cpu() { awk -v d=$(($2 - $1)) -v hz="$CLK_TCK" -v n="$reqs" 'BEGIN { printf "%.2f\n", (n > 0) ? d * 1e6 / hz / n : 0 }'; }
        pc=$(cpu "$p0" "$p1")
        bc=$(cpu "$b0" "$b1")
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$p" "$rps" "$p99" "$pc" "$bc" "$reqs" >>"$RAW"
        printf 'round %d/%d  %-4s %9.0f req/s  p99 %6s us  pinlb %6s us/req  backend %6s us/req\n' \
            "$r" "$ROUNDS" "$p" "$rps" "$p99" "$pc" "$bc" >&2
    done
done

declare -A RPS P99 PCPU BCPU
for p in tcp unix; do
    read -r "RPS[$p]" _ _ < <(stats "$p" 3)
    read -r "P99[$p]" _ _ < <(stats "$p" 4)
    read -r "PCPU[$p]" _ _ < <(stats "$p" 5)
    read -r "BCPU[$p]" _ _ < <(stats "$p" 6)
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f\n", (b > 0) ? a / b : 0 }'; }
echo
echo "Same Node.js backend over TCP and a Unix socket, through pinlb (1 worker, core 0); backend and \`wrk -t1 -c$CONNS\` on core 1; medians of $ROUNDS interleaved rounds of $DURATION."
echo
echo "| backend address | req/s | p99 µs | pinlb CPU µs/req | backend CPU µs/req |"
echo "|---|---:|---:|---:|---:|"
for p in tcp unix; do
    printf '| %s | %.0f | %s | %s | %s |\n' "$p" "${RPS[$p]}" "${P99[$p]}" "${PCPU[$p]}" "${BCPU[$p]}"
done
echo
echo "unix / tcp: req/s $(ratio "${RPS[unix]}" "${RPS[tcp]}"), pinlb CPU per request $(ratio "${PCPU[unix]}" "${PCPU[tcp]}"), backend CPU per request $(ratio "${BCPU[unix]}" "${BCPU[tcp]}")"
