#!/usr/bin/env bash
# benches/soak.sh - pinlb under steady load for a long time, with everything that
# goes wrong in real life at once: connection churn, slow clients, and a backend
# killed and restarted every minute. Does memory or the fd count creep, and does
# any request fail?
#
# Topology (meant for a 2-core machine):
#   core 0: pinlb, one worker, round robin over three backends, retries and passive
#           accounting as shipped (benches/peers/soak/pinlb.toml).
#   core 1: three `pinlb backend` processes, one port each, and every client:
#     - the main load, `pinlb bench --rate R` (open loop, $CONNS keep-alive
#       connections) at $LOAD_PCT% of the capacity measured first;
#     - churn: $CHURN_CLIENTS curl processes, each sending `Connection: close`
#       requests at $CHURN_RATE/s, so every request is a new connection;
#     - slow clients: $SLOW_CLIENTS bash loops, each writing a request head over
#       /dev/tcp one line per second (5 s a head, under pinlb's 10 s
#       header_timeout), then reading the status line; then a new connection.
#   Every $RESTART_EVERY s one backend (in turn) gets SIGKILL - a crash, its
#   connections reset - and is started again on the same port at once.
#
# Procedure: start the backends and pinlb; read pinlb's VmRSS and open fds
# (/proc/PID/status, /proc/PID/fd) as the baseline; measure capacity with a
# closed-loop `pinlb bench` ($CAPACITY_S, after a 2 s warm-up); start the load,
# churn and slow clients for $DURATION s, restarting a backend every
# $RESTART_EVERY s and sampling RSS and fds every minute; when the load stops, wait
# until the fd count holds still (bounded, 30 s) and read both again.
#
# Latency is counted from each request's scheduled send time. On a 2-core machine core 1
# carries the backends and every client, and the open loop falls behind there well below the
# closed-loop capacity, so the percentiles then measure that backlog (see HISTORY.md); lower
# LOAD_PCT, or use a third core for the clients, for latency figures that mean something.
#
# Counted as failures: the main load's errors (connect, timeout - 2 s - , read,
# non-2xx), churn requests that did not get a 200 (curl's 000 is a failed
# connection), slow clients that did not get `HTTP/1.1 200`. pinlb retries a
# refused connect and a GET whose backend died under it, so every one should be 0.
#
# Usage (from anywhere; root or not):
#   bash benches/soak.sh
#   DURATION=60 RESTART_EVERY=20 bash benches/soak.sh
# Environment:
#   FEATURES=1          run benches/soak_features.sh instead: gzip on HTTP/1.1 and h2c, a
#                       rate-limit zone, response buffering and a JSON access log together
#                       (issue 53); its own variables are in its header
#   DURATION=600        seconds of load
#   RESTART_EVERY=60    seconds between backend restarts
#   LOAD_PCT=80         open-loop rate as a percentage of the measured capacity
#   CONNS=64            main load connections
#   CAPACITY_S=10       seconds of the closed-loop capacity measurement
#   CHURN_CLIENTS=2     churn processes; CHURN_RATE=100 requests/s each
#   SLOW_CLIENTS=4      slow-client loops
#   PINLB=target/release/pinlb    pinlb binary (relative to the repo root)
#   OUT_MD=/tmp/pinlb-soak.md     where the Markdown report is written
#   PORT_BASE=28380     ports: the first free loopback ports >= PORT_BASE
#   KEEP_TMP=0          1 = keep the temp dir (configs, logs, JSON)
# Needs: curl, taskset, ss, awk, jq.

set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
CMDLINE="bash $0${*:+ $*}"
# FEATURES=1: the soak with the features on together instead (benches/soak_features.sh).
if [[ ${FEATURES:-0} == 1 ]]; then
    exec bash "$ROOT/benches/soak_features.sh" "$@"
fi

DURATION=${DURATION:-600}
RESTART_EVERY=${RESTART_EVERY:-60}
LOAD_PCT=${LOAD_PCT:-80}
CONNS=${CONNS:-64}
CAPACITY_S=${CAPACITY_S:-10}
CHURN_CLIENTS=${CHURN_CLIENTS:-2}
CHURN_RATE=${CHURN_RATE:-100}
SLOW_CLIENTS=${SLOW_CLIENTS:-4}
PINLB=${PINLB:-target/release/pinlb}
OUT_MD=${OUT_MD:-/tmp/pinlb-soak.md}
PORT_BASE=${PORT_BASE:-28380}
KEEP_TMP=${KEEP_TMP:-0}

case $PINLB in /*) ;; *) PINLB="$ROOT/$PINLB" ;; esac

log() { printf '[soak] %s\n' "$*" >&2; }
die() { printf '[soak] ERROR: %s\n' "$*" >&2; exit 1; }

for v in DURATION RESTART_EVERY LOAD_PCT CONNS CAPACITY_S CHURN_RATE; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
for v in CHURN_CLIENTS SLOW_CLIENTS; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a whole number (got '${!v}')"
done
for t in curl taskset ss awk jq; do
    command -v "$t" >/dev/null 2>&1 || die "required tool '$t' not found"
done
[[ -x $PINLB ]] || die "pinlb binary not found at $PINLB (cargo build --release, or set PINLB=...)"
(($(nproc) >= 2)) || die "need at least 2 cores (0 and 1)"

# ---------------------------------------------------------------- cleanup
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pinlb-soak.XXXXXX")
PIDS=()        # long-lived processes: pinlb and the client loops
BACKEND_PID=() # by backend index 1-3

running_pids() { echo "${PIDS[@]}" "${BACKEND_PID[@]}"; }

# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
install_cleanup

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
fds() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
# Established connections from pinlb to the backends: its upstream keep-alive pool.
pooled() {
    ss -tnH state established "( dport = :${BACKEND_PORT[1]} or dport = :${BACKEND_PORT[2]} or dport = :${BACKEND_PORT[3]} )" | wc -l
}

start_backend() { # INDEX
    local i=$1
    taskset -c 1 "$PINLB" backend --listen "127.0.0.1:${BACKEND_PORT[$i]}" --cpus 1 \
        >>"$WORK/backend$i.log" 2>&1 &
    BACKEND_PID[i]=$!
    wait_ready "backend $i" "${BACKEND_PORT[$i]}" "${BACKEND_PID[$i]}" "$WORK/backend$i.log"
}

# churn N: Connection: close requests at CHURN_RATE/s until END, one status per line.
churn() {
    local n=$1
    while ((SECONDS < END)); do
        taskset -c 1 curl -s -o /dev/null -w '%{http_code}\n' -H 'Connection: close' \
            --max-time 5 --rate "$CHURN_RATE/s" "$URL?churn$n=[1-$CHURN_RATE]" \
            >>"$WORK/churn$n.log" 2>/dev/null || true
    done
}

# slow N: one request head a line per second, then its status line; until END.
slow() {
    local n=$1 fd line
    while ((SECONDS < END)); do
        if ! exec {fd}<>"/dev/tcp/127.0.0.1/$PINLB_PORT"; then
            echo "connect-failed" >>"$WORK/slow$n.log"
            sleep 1
            continue
        fi
        line=""
        # An unanswered or cut-off request leaves `line` empty and is counted as bad below.
        if {
            printf 'GET /slow HTTP/1.1\r\n' && sleep 1 &&
                printf 'Host: soak\r\n' && sleep 1 &&
                printf 'User-Agent: slow-bash\r\n' && sleep 1 &&
                printf 'X-Slow: 1\r\n' && sleep 1 &&
                printf 'Accept: */*\r\n' && sleep 1 &&
                printf 'Connection: close\r\n\r\n'
        } 1>&"$fd" 2>/dev/null; then
            read -r -t 5 -u "$fd" line || true
        fi
        exec {fd}>&-
        if [[ $line == "HTTP/1.1 200"* ]]; then echo ok; else echo "bad ${line:-none}"; fi >>"$WORK/slow$n.log"
    done
}

# ---------------------------------------------------------------- start
declare -a BACKEND_PORT
for i in 1 2 3; do
    pick_port
    BACKEND_PORT[i]=$PICKED
done
pick_port
PINLB_PORT=$PICKED
URL="http://127.0.0.1:$PINLB_PORT/"

log "work dir $WORK; pinlb port $PINLB_PORT; backends ${BACKEND_PORT[*]}"
for i in 1 2 3; do start_backend "$i"; done
sed -e "s|@PORT@|$PINLB_PORT|g" -e "s|@BACKEND_PORT1@|${BACKEND_PORT[1]}|g" \
    -e "s|@BACKEND_PORT2@|${BACKEND_PORT[2]}|g" -e "s|@BACKEND_PORT3@|${BACKEND_PORT[3]}|g" \
    "$ROOT/benches/peers/soak/pinlb.toml" >"$WORK/pinlb.toml"
"$PINLB" check -c "$WORK/pinlb.toml" >"$WORK/check.log" 2>&1 || {
    cat "$WORK/check.log" >&2
    die "pinlb check rejected the soak config"
}
RUST_LOG=warn taskset -c 0 "$PINLB" serve -c "$WORK/pinlb.toml" >"$WORK/pinlb.log" 2>&1 &
PID=$!
PIDS+=("$PID")
wait_ready pinlb "$PINLB_PORT" "$PID" "$WORK/pinlb.log"
PINLB_VERSION=$("$PINLB" --version 2>&1 | awk 'NR == 1 {print $NF}')

host_facts
RSS0=$(rss_kib "$PID")
FD0=$(fds "$PID")
POOL0=$(pooled)
log "baseline: VmRSS $RSS0 KiB, $FD0 open fds ($POOL0 pooled backend connections)"

log "capacity: closed loop, $CONNS connections, ${CAPACITY_S}s"
taskset -c 1 "$PINLB" bench -t 1 -c "$CONNS" -d "${CAPACITY_S}s" --warmup 2s --rounds 1 --cpus 1 \
    --json "$WORK/capacity.json" "$URL" >"$WORK/capacity.txt" 2>&1 || {
    cat "$WORK/capacity.txt" >&2
    die "capacity run failed"
}
CAPACITY=$(jq -r '.targets[0].requests_per_sec.median | floor' "$WORK/capacity.json")
RATE=$((CAPACITY * LOAD_PCT / 100))
RSS_CAP=$(rss_kib "$PID")
log "capacity $CAPACITY req/s; load at $RATE req/s for ${DURATION}s; VmRSS now $RSS_CAP KiB"

# ---------------------------------------------------------------- load
END=$((SECONDS + DURATION))
: >"$WORK/churn0.log" # so that the globs below match with no clients of a kind
: >"$WORK/slow0.log"
taskset -c 1 "$PINLB" bench -t 1 -c "$CONNS" -d "${DURATION}s" --warmup 0s --rounds 1 --cpus 1 \
    --rate "$RATE" --json "$WORK/soak.json" "$URL" >"$WORK/soak.txt" 2>&1 &
LOAD_PID=$!
PIDS+=("$LOAD_PID")
for ((n = 1; n <= CHURN_CLIENTS; n++)); do
    churn "$n" &
    PIDS+=("$!")
done
for ((n = 1; n <= SLOW_CLIENTS; n++)); do
    slow "$n" &
    PIDS+=("$!")
done

SAMPLES="$WORK/samples.tsv" # minute rss_kib fds pooled
RESTARTS=0
victim=0
next_restart=$((SECONDS + RESTART_EVERY))
next_sample=$((SECONDS + 60))
minute=0
# One pass a second; bounded by END (plus the restarts' own bounded waits).
while ((SECONDS < END)); do
    sleep 1
    if ((SECONDS >= next_restart && SECONDS < END - 2)); then
        victim=$((victim % 3 + 1))
        log "t=$((DURATION - END + SECONDS))s: SIGKILL backend $victim, restart"
        kill -KILL "${BACKEND_PID[$victim]}" 2>/dev/null || true
        wait "${BACKEND_PID[$victim]}" 2>/dev/null || true
        start_backend "$victim"
        RESTARTS=$((RESTARTS + 1))
        next_restart=$((next_restart + RESTART_EVERY))
    fi
    if ((SECONDS >= next_sample)); then
        minute=$((minute + 1))
        printf '%s\t%s\t%s\t%s\n' "$minute" "$(rss_kib "$PID")" "$(fds "$PID")" "$(pooled)" >>"$SAMPLES"
        next_sample=$((next_sample + 60))
    fi
done
RSS_END=$(rss_kib "$PID")
FD_END_LOAD=$(fds "$PID")

wait "$LOAD_PID" || die "the load generator failed: $(tail -n 5 "$WORK/soak.txt")"
for p in "${PIDS[@]:2}"; do wait "$p" 2>/dev/null || true; done
# The clients are gone; wait (bounded) until pinlb has closed their connections.
last=-1
for ((i = 0; i < 30; i++)); do
    now=$(fds "$PID")
    ((now == last)) && break
    last=$now
    sleep 1
done
RSS_AFTER=$(rss_kib "$PID")
FD_AFTER=$(fds "$PID")
POOL_AFTER=$(pooled)
kill -0 "$PID" 2>/dev/null || die "pinlb died during the soak (log: $WORK/pinlb.log)"

# ---------------------------------------------------------------- results
j() { jq -r "$1" "$WORK/soak.json"; }
SENT=$(j '.targets[0].requests.sent')
OK=$(j '.targets[0].requests.ok')
E_CONNECT=$(j '.targets[0].requests.errors.connect')
E_TIMEOUT=$(j '.targets[0].requests.errors.timeout')
E_READ=$(j '.targets[0].requests.errors.read')
E_NON2XX=$(j '.targets[0].requests.errors.non_2xx')
RPS=$(j '.targets[0].requests_per_sec.median | floor')
P50=$(j '.targets[0].latency.p50_us | floor')
P99=$(j '.targets[0].latency.p99_us | floor')
P999=$(j '.targets[0].latency.p999_us | floor')
MAXLAT=$(j '.targets[0].latency.max_us | floor')
CHURN_TOTAL=$(cat "$WORK"/churn*.log 2>/dev/null | wc -l)
CHURN_BAD=$(cat "$WORK"/churn*.log 2>/dev/null | grep -vc '^200$' || true)
SLOW_TOTAL=$(cat "$WORK"/slow*.log 2>/dev/null | wc -l)
SLOW_BAD=$(cat "$WORK"/slow*.log 2>/dev/null | grep -vc '^ok$' || true)
WARNS=$(grep -c 'WARN' "$WORK/pinlb.log" || true)
MAIN_ERR=$((E_CONNECT + E_TIMEOUT + E_READ + E_NON2XX))
FAILED=$((MAIN_ERR + CHURN_BAD + SLOW_BAD))

MD="$WORK/report.md"
{
    echo "### Soak: ${DURATION} s at ${LOAD_PCT}% of capacity ($(date -u +%Y-%m-%d), commit $COMMIT)"
    echo
    echo "- Command: \`DURATION=$DURATION RESTART_EVERY=$RESTART_EVERY LOAD_PCT=$LOAD_PCT CONNS=$CONNS CHURN_CLIENTS=$CHURN_CLIENTS CHURN_RATE=$CHURN_RATE SLOW_CLIENTS=$SLOW_CLIENTS $CMDLINE\`"
    echo "- Host: nproc=$(nproc), $CPU_MODEL, $(uname -sr); pinlb $PINLB_VERSION"
    echo "- Topology: pinlb (one worker) on core 0, round robin over three \`pinlb backend\` processes on core 1. On core 1 too: \`pinlb bench --rate $RATE\` (open loop, $CONNS keep-alive connections; capacity measured first, closed loop, ${CAPACITY_S} s: $CAPACITY req/s), $CHURN_CLIENTS curl loops at $CHURN_RATE req/s each with \`Connection: close\` (a new connection per request), $SLOW_CLIENTS bash loops writing a request head a line per second over 5 s. A backend got SIGKILL and was restarted every $RESTART_EVERY s ($RESTARTS restarts)."
    echo
    echo "| | value |"
    echo "|---|---:|"
    echo "| main load: requests sent / 2xx | $SENT / $OK |"
    echo "| main load: errors (connect / timeout / read / non-2xx) | $E_CONNECT / $E_TIMEOUT / $E_READ / $E_NON2XX |"
    echo "| main load: req/s achieved; latency p50 / p99 / p99.9 / max µs | $RPS; $P50 / $P99 / $P999 / $MAXLAT |"
    echo "| churn: requests (a new connection each) / not 200 | $CHURN_TOTAL / $CHURN_BAD |"
    echo "| slow clients: requests / not 200 | $SLOW_TOTAL / $SLOW_BAD |"
    echo "| **failed requests, all clients** | **$FAILED** |"
    echo "| pinlb VmRSS: at start / after the capacity run / at the end of the load / after it | $RSS0 / $RSS_CAP / $RSS_END / $RSS_AFTER KiB |"
    echo "| pinlb open fds: at start / at the end of the load / after it | $FD0 / $FD_END_LOAD / $FD_AFTER |"
    echo "| of which pooled backend connections: at start / after | $POOL0 / $POOL_AFTER |"
    echo "| pinlb WARN log lines | $WARNS |"
    echo
    echo "<details><summary>pinlb each minute</summary>"
    echo
    echo "| minute | VmRSS KiB | open fds | pooled backend connections |"
    echo "|---:|---:|---:|---:|"
    awk -F'\t' '{ printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4 }' "$SAMPLES" 2>/dev/null || true
    echo
    echo "</details>"
} >"$MD"

publish_report "$MD"
