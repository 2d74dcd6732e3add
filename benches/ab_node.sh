#!/usr/bin/env bash
# benches/ab_node.sh - `ab -k` through pinlb and through nginx to four Node.js processes that
# answer chunked (res.writeHead + res.end, benches/peers/node-app.js), in interleaved rounds.
# ab -k is an HTTP/1.0 keep-alive client: it can't take chunked. nginx then closes every
# connection (ab counts 0 keep-alive requests); pinlb reads the small body ahead and sends it
# with its Content-Length, keeping the connection (docs/behaviour.md). Issue 17's bar: every
# request a keep-alive request, 0 failed, and req/s at least 2x nginx's in the same run.
#
# Topology (meant for a 2-core machine; the load generator has a core to itself):
#   core 0: the proxy under test, one worker (pinlb: benches/peers/pinlb-node.toml; nginx:
#           benches/peers/nginx-node.conf, worker_processes 1), and the 4 Node.js processes
#           (taskset -c 0 node benches/peers/node-app.js, PORT=...)
#   core 1: taskset -c 1 ab -k -n $REQUESTS -c $CONNS http://127.0.0.1:PORT/
#
# Procedure: node, pinlb and nginx start once and are polled (curl, bounded) until they answer
# "hello world". Then for each of $ROUNDS rounds: ab through pinlb, then ab through nginx.
# Measured per round and proxy:
#   req/s         ab's "Requests per second"
#   keep-alive    ab's "Keep-Alive requests" (of "Complete requests")
#   failed        ab's "Failed requests" + "Non-2xx responses"
#   CPU us/req    the proxy's utime+stime over the run (/proc, all its processes), and the four
#                 node processes' together, each divided by the requests
#   core busy     % busy of cores 0 and 1 during the run (/proc/stat)
# Summary: medians over rounds, pinlb / nginx req/s paired per round (median of per-round
# ratios). Markdown, also in $OUT_MD.
#
# Usage:  bash benches/ab_node.sh
# Environment:
#   ROUNDS=5  REQUESTS=20000  CONNS=100
#   PINLB=target/release/pinlb    pinlb binary (relative to the repo root)
#   OUT_MD=/tmp/pinlb-ab-node.md  where the Markdown report is written
#   PORT_BASE=18380  KEEP_TMP=0
# Needs: node (/usr/bin/node), nginx, ab (apache2-utils), curl, taskset, ss, awk.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
CMDLINE="bash $0${*:+ $*}"
ROUNDS=${ROUNDS:-5}
REQUESTS=${REQUESTS:-20000}
CONNS=${CONNS:-100}
PINLB=${PINLB:-target/release/pinlb}
OUT_MD=${OUT_MD:-/tmp/pinlb-ab-node.md}
PORT_BASE=${PORT_BASE:-18380}
KEEP_TMP=${KEEP_TMP:-0}
case $PINLB in /*) ;; *) PINLB="$ROOT/$PINLB" ;; esac
PATH="$PATH:/usr/sbin:/sbin"

log() { printf '[ab_node] %s\n' "$*" >&2; }
die() {
    printf '[ab_node] ERROR: %s\n' "$*" >&2
    exit 1
}
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $REQUESTS =~ ^[1-9][0-9]*$ && $CONNS =~ ^[1-9][0-9]*$ ]] ||
    die "ROUNDS, REQUESTS and CONNS must be positive integers"

# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
install_missing "nginx-light apache2-utils nodejs" nginx ab node
require nginx ab node curl taskset ss awk sort
[[ -x $PINLB ]] || die "pinlb binary not found at $PINLB (build it: cargo build --release, or set PINLB=...)"
(($(nproc) >= 2)) || die "need at least 2 cores (0 and 1); nproc=$(nproc)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/pinlb-ab-node.XXXXXX")
chmod 755 "$WORK"
PIDS=()
GEN_PID=""
running_pids() { echo "$GEN_PID" "${PIDS[@]}"; }
install_cleanup

declare -A PORT PID_OF VERSION LOGF
NODE_PORTS=()
NODE_PIDS=()
for i in 0 1 2 3; do
    pick_port
    NODE_PORTS+=("$PICKED")
done
# start_peer renders "$PEERS_DIR/nginx.conf": here that is nginx-node.conf.
PEERS_DIR="$WORK/peers"
mkdir -p "$PEERS_DIR"
cp "$ROOT/benches/peers/nginx-node.conf" "$PEERS_DIR/nginx.conf"
render() {
    sed -e "s|@DIR@|$4|g" -e "s|@PORT@|$3|g" -e "s|@NODE0@|${NODE_PORTS[0]}|g" \
        -e "s|@NODE1@|${NODE_PORTS[1]}|g" -e "s|@NODE2@|${NODE_PORTS[2]}|g" \
        -e "s|@NODE3@|${NODE_PORTS[3]}|g" "$1" >"$2"
}

read -r IDLE_BUSY0 IDLE_BUSY1 < <(core_busy_1s)
for i in 0 1 2 3; do
    PORT=${NODE_PORTS[$i]} taskset -c 0 node "$ROOT/benches/peers/node-app.js" \
        >"$WORK/node$i.log" 2>&1 &
    NODE_PIDS+=("$!")
    PIDS+=("$!")
    wait_ready "node$i" "${NODE_PORTS[$i]}" "$!" "$WORK/node$i.log"
done
for p in pinlb nginx; do
    pick_port
    PORT[$p]=$PICKED
    start_peer "$p" "$ROOT/benches/peers/pinlb-node.toml"
done

host_facts
AB_VERSION=$(ab -V 2>&1 | awk 'NR == 1 {print $5}' || true)
echo "== ab -k through pinlb and nginx to 4 Node.js processes (writeHead + end: chunked) =="
echo "command:   ROUNDS=$ROUNDS REQUESTS=$REQUESTS CONNS=$CONNS PINLB=$PINLB $CMDLINE"
echo "nproc:     $(nproc) ($CPU_MODEL); commit $COMMIT; node $(node --version); ab $AB_VERSION"
echo "topology:  core 0: the proxy (one worker) + 4 node processes ${NODE_PORTS[*]}; core 1: taskset -c 1 ab -q -k -n $REQUESTS -c $CONNS URL"
describe_procs pinlb nginx

RAW="$WORK/raw.tsv" # round proxy rps keepalive failed complete proxy_us node_us core0 core1
: >"$RAW"
for ((r = 1; r <= ROUNDS; r++)); do
    for p in pinlb nginx; do
        out="$WORK/$p-$r.out"
        mapfile -t tree < <(proc_tree "${PID_OF[$p]}")
        t0=$(cpu_ticks "${tree[@]}")
        n0=$(cpu_ticks "${NODE_PIDS[@]}")
        j0=$(core_jiffies)
        run_timed "$out" taskset -c 1 ab -q -k -n "$REQUESTS" -c "$CONNS" "http://127.0.0.1:${PORT[$p]}/"
        read -r busy0 busy1 < <(core_busy "$j0" "$(core_jiffies)")
        t1=$(cpu_ticks "${tree[@]}")
        n1=$(cpu_ticks "${NODE_PIDS[@]}")
        rps=$(awk '/^Requests per second:/ {print $4}' "$out")
        done_n=$(awk '/^Complete requests:/ {print $3}' "$out")
        ka=$(awk '/^Keep-Alive requests:/ {print $3}' "$out")
        failed=$(awk '/^Failed requests:/ {f = $3} /^Non-2xx responses:/ {n = $3} END {print f + n}' "$out")
        [[ -n $rps && -n $done_n ]] || {
            cat "$out" >&2
            die "could not parse ab's output ($out)"
        }
        hz=$(getconf CLK_TCK)
        per_req() { awk -v t="$1" -v hz="$hz" -v n="$done_n" 'BEGIN { printf "%.1f\n", (n > 0) ? t / hz * 1e6 / n : 0 }'; }
        p_us=$(per_req $((t1 - t0)))
        n_us=$(per_req $((n1 - n0)))
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$p" "$rps" "${ka:-0}" "$failed" "$done_n" "$p_us" "$n_us" "$busy0" "$busy1" >>"$RAW"
        log "round $r $p: $rps req/s, keep-alive ${ka:-0} of $done_n, $failed failed, proxy ${p_us} us CPU/req, node ${n_us} us CPU/req, core0 ${busy0}% core1 ${busy1}%"
    done
done

paired=$(awk -F'\t' '$2 == "nginx" {a[$1] = $3} $2 == "pinlb" {p[$1] = $3}
    END { for (r in a) if (a[r] > 0 && (r in p)) print p[r] / a[r] }' "$RAW" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) { print "nan"; exit }
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.2f\n", m }')
MD="$WORK/report.md"
{
    echo "### ab -k -n $REQUESTS -c $CONNS through a proxy to 4 Node.js processes (chunked), $ROUNDS rounds"
    echo
    echo "| proxy | req/s median | min | max | keep-alive requests (median) | failed (median) | proxy CPU µs/req | node CPU µs/req |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    for p in pinlb nginx; do
        read -r rps mn mx < <(stats "$p" 3)
        read -r ka _ _ < <(stats "$p" 4)
        read -r failed _ _ < <(stats "$p" 5)
        read -r pus _ _ < <(stats "$p" 7)
        read -r nus _ _ < <(stats "$p" 8)
        printf '| %s %s | %.0f | %.0f | %.0f | %s of %s | %s | %s | %s |\n' "$p" "${VERSION[$p]}" "$rps" "$mn" "$mx" "$ka" "$REQUESTS" "$failed" "$pus" "$nus"
    done
    echo
    echo "pinlb / nginx req/s, paired per round: $paired"
    raw_section "Per round (round, proxy, req/s, keep-alive, failed, complete, proxy µs/req, node µs/req, core0 %, core1 %):"
} >"$MD"
publish_report "$MD"
