#!/usr/bin/env bash
# benches/overload.sh - issue 27, "Overload must queue, not fail", and issue 47's comparison:
# far more clients than three single-threaded Node.js backends can serve at once, through pinlb
# with its defaults (since issue 47: a learned per-backend concurrency limit and a queue),
# pinlb hand-tuned (a fixed max_conns and a queue), nginx, and HAProxy hand-tuned with
# maxconn 16 and with maxconn 32. A proxy that queues keeps every request (slower, but
# answered); one that fails them shows lost requests. Interleaved runs, one table, and the
# ratios issue 47's bars are stated in.
#
# Topology (meant for a 2-core machine; issue 27's users' setup):
#   core 0: the proxy under test, one worker (pinlb [runtime] cpus = [0]; nginx
#           worker_processes 1; haproxy nbthread 1), started with taskset -c 0
#   core 1: three Node.js processes (benches/peers/overload/node-busy.js: plain
#           http.createServer, a `for (var i=0;i<180000;i++){ var j = i/3; }` busy loop per
#           request, then res.end('hello world'); Node's default listen backlog, 511) and the
#           load generator: taskset -c 1 ab -q -r -s 30 -c C -t $DURATION -n $AB_REQUESTS URL
#           (no keep-alive: a connection per request; -n after -t, because this ab's -t alone
#           stops at 50000 requests, and a run should be bound by time)
#   Peers (benches/peers/overload/*, rendered into a mktemp -d dir):
#   pinlb        defaults: algorithm = "least_conn" and the three backends, every other key at
#                its default. Since issue 47 that is a learned concurrency limit per backend
#                (adaptive = true, adaptive_min 2, adaptive_max 1000) and a request queue; a
#                binary from before issue 47 has neither (no limit, no queue): the report says
#                which this binary is (whether `pinlb check` takes `adaptive = true`)
#   pinlb-queue  hand-tuned: the same plus max_conns = $MAXCONN per backend (a fixed limit,
#                which overrides the learned one), queue = 10000 and [upstream.app.timeouts]
#                queue = "30s" (keys new with issue 27), as HAProxy's maxconn + timeout queue.
#                PINLB_QUEUE=0 skips it
#   nginx        least_conn, keepalive 64, HTTP/1.1 with Connection "" to the backends, default
#                proxy_connect_timeout (60 s), no max_conns (nginx queues only in its commercial
#                version)
#   haproxy-N    hand-tuned: balance leastconn, maxconn N per server (N from the peer's name:
#                haproxy-16, haproxy-32, any positive N), timeout queue 30s (maxqueue
#                unlimited), http-reuse always, option http-keep-alive, timeouts connect 5s,
#                client/server 60s. `haproxy` alone is haproxy-$MAXCONN (the peer's name
#                before issue 47)
#   A binary that rejects a pinlb peer's configuration (in `pinlb check` or at start-up: keys
#   newer than the binary) has that peer skipped, with the reason in the report.
#   Every proxy listens with its own default backlog: pinlb's is net.core.somaxconn (issue 27),
#   nginx's 511, HAProxy's its frontend's maxconn (capped by somaxconn).
#
# Procedure: the Node.js processes and every peer start once and are polled (curl, bounded)
# until they answer "hello world"; each pinlb peer's configuration is first tried with
# `pinlb check` and a trial start. Then for each of $ROUNDS rounds, for each concurrency C in
# $CONCURRENCY, each peer in turn ($PEERS' order; then the next C):
#   1. wait (bounded, $DRAIN_S s) until the previous run's connections have drained (ss, on the
#      proxies' and backends' ports): no client connection but TIME-WAIT, no backend connection
#      with bytes queued or being opened, no accept queue, and at most $DRAIN_TW in TIME-WAIT;
#      then check the peer is alive and answers (curl, bounded; restarted only if it died);
#   2. the recorded ab run against it.
# Measured per run:
#   complete     ab's "Complete requests" (answered or not: ab counts a reset request too)
#   lost         requests not answered 2xx: ab's Non-2xx responses + the Connect, Receive and
#                Exceptions failures + the Length failures those don't explain. Not ab's Failed
#                + Non-2xx summed: ab counts a 503 whose body differs from the first response's
#                under both Non-2xx and Failed (Length), and a reset under Receive and Length,
#                so that sum can exceed the complete requests. The per-run section has ab's own
#                counters (and their plain sum), and a warning says when ab's first response,
#                the one it measures lengths against, was not the backends' 11-byte body.
#   req/s        ab's "Requests per second"
#   p50, p99     ab's "Percentage of the requests served within a certain time" table, ms
#   CPU µs/req   the proxy's utime+stime (/proc, all its processes) over the run / complete
#   core busy    % busy of cores 0 and 1 during the run (/proc/stat), per-run section only
#   other        % of cores 0 and 1 that other programs took during the run: user+system
#                jiffies (/proc/stat) less the utime+stime of the proxy, the backends, ab and
#                ksoftirqd/0 and /1 (the loopback traffic's softirqs); over 10%
#                and the run is flagged noisy (log and report)
# Before issue 27, pinlb's defaults lost requests in a burst about a second into a run: its first
# connects to the backends overflowed Node's 511 backlog, timed out after timeouts.connect (then
# 1 s), and max_fails = 1 then skipped the backends (503). Whether the burst happens depends on how fast
# ab's connections ramp up, so it varies from run to run (with the cores shared with a build,
# a 10 s run at C=8000 lost none, a 3 s one 5029 of 16795): use ROUNDS=3 or more to see it.
# With ROUNDS > 1 the table shows the medians over rounds. Then issue 47's bars, per pinlb peer
# and C, from those medians: its p99 / haproxy-32's p99 (bar: <= 1.1), its lost requests (bar:
# 0) and its req/s / nginx's req/s (bar: >= 1.1); "n/a" where the peer compared against was not
# run (or gave no figure). Markdown on stdout and in $OUT_MD, headed by the command line, date,
# nproc, CPU model, the peers' versions and what each peer is.
#
# Usage:  bash benches/overload.sh
#         PINLB=/tmp/pinlb-base DURATION=3 CONCURRENCY=1000 PEERS=pinlb bash benches/overload.sh
#         PEERS="pinlb haproxy-32" CONCURRENCY=5000 ROUNDS=3 bash benches/overload.sh
# Environment:
#   CONCURRENCY="1000 3000 5000 8000"   ab -c values, in this order
#   DURATION=10        seconds per run (ab -t)
#   ROUNDS=1           repeats of the whole interleave
#   MAXCONN=32         requests in flight per backend for pinlb-queue (and the `haproxy` alias)
#   PEERS="pinlb pinlb-queue nginx haproxy-16 haproxy-32"   peers to run, in this order
#   PINLB_QUEUE=1      0 = skip pinlb-queue
#   PINLB=target/release/pinlb    pinlb binary (relative to the repo root)
#   OUT_MD=/tmp/pinlb-overload.md where the Markdown report is written
#   PORT_BASE=18480    ports: the first free loopback ports >= PORT_BASE: 3 backends, then peers
#   KEEP_TMP=0         1 = keep the temp dir (configs, logs, ab outputs)
#   NOFILE=20000       open-files limit set with ulimit -n (capped at the hard limit); it must
#                      exceed the largest C by 100 at least
#   AB_REQUESTS=DURATION*100000   ab -n, only a cap (ab sizes its statistics array on it)
#   DRAIN_S=20  DRAIN_TW=10000    the drain wait's bound in seconds and TIME-WAIT limit
#   BUSY_LOOP=180000   the backends' busy-loop count
# Needs: node, nginx, haproxy, ab (apache2-utils; installed with apt-get if missing and root),
# curl, taskset, ss, awk, sort, getconf. Don't run it while something else is busy on the
# machine: both cores are part of the measurement (the report warns when they were busy).
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_DIR="$ROOT/benches/peers/overload"
CMDLINE="bash $0${*:+ $*}"

CONCURRENCY=${CONCURRENCY:-1000 3000 5000 8000}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-1}
MAXCONN=${MAXCONN:-32}
PEERS=${PEERS:-pinlb pinlb-queue nginx haproxy-16 haproxy-32}
PINLB_QUEUE=${PINLB_QUEUE:-1}
PINLB=${PINLB:-target/release/pinlb}
OUT_MD=${OUT_MD:-/tmp/pinlb-overload.md}
PORT_BASE=${PORT_BASE:-18480}
KEEP_TMP=${KEEP_TMP:-0}
NOFILE=${NOFILE:-20000}
DRAIN_S=${DRAIN_S:-20}
DRAIN_TW=${DRAIN_TW:-10000}
BUSY_LOOP=${BUSY_LOOP:-180000}
case $PINLB in /*) ;; *) PINLB="$ROOT/$PINLB" ;; esac
PATH="$PATH:/usr/sbin:/sbin"

log() { printf '[overload] %s\n' "$*" >&2; }
die() {
    printf '[overload] ERROR: %s\n' "$*" >&2
    exit 1
}

for v in DURATION ROUNDS MAXCONN NOFILE DRAIN_S BUSY_LOOP; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
[[ $DRAIN_TW =~ ^[0-9]+$ && $PORT_BASE =~ ^[0-9]+$ ]] || die "DRAIN_TW and PORT_BASE must be numbers"
AB_REQUESTS=${AB_REQUESTS:-$((DURATION * 100000))}
[[ $AB_REQUESTS =~ ^[1-9][0-9]*$ ]] || die "AB_REQUESTS must be a positive integer (got '$AB_REQUESTS')"
read -r -a CONC_LIST <<<"$CONCURRENCY"
((${#CONC_LIST[@]} > 0)) || die "CONCURRENCY is empty"
MAX_C=0
for c in "${CONC_LIST[@]}"; do
    [[ $c =~ ^[1-9][0-9]*$ ]] || die "CONCURRENCY holds '$c', not a positive integer"
    if ((c > MAX_C)); then MAX_C=$c; fi
done
read -r -a PEER_LIST <<<"$PEERS"
((${#PEER_LIST[@]} > 0)) || die "PEERS is empty"
# peer_maxconn P: the per-backend limit of a hand-tuned peer: N for haproxy-N, $MAXCONN for
# `haproxy` (haproxy-$MAXCONN, its name before issue 47) and pinlb-queue; empty for the others.
peer_maxconn() {
    case $1 in
    haproxy-*) echo "${1#haproxy-}" ;;
    haproxy | pinlb-queue) echo "$MAXCONN" ;;
    esac
}
HAPROXY_MAX_SERVER_CONN=0 # the largest haproxy-N's N
for p in "${PEER_LIST[@]}"; do
    case $p in
    pinlb | pinlb-queue | nginx | haproxy) ;;
    haproxy-*) [[ ${p#haproxy-} =~ ^[1-9][0-9]*$ ]] || die "peer '$p': haproxy-N needs a positive integer N (haproxy-16, haproxy-32)" ;;
    *) die "unknown peer '$p' (known: pinlb pinlb-queue nginx haproxy-N with N the per-server maxconn, e.g. haproxy-16 haproxy-32; haproxy = haproxy-$MAXCONN)" ;;
    esac
    if [[ $p == haproxy* ]] && (($(peer_maxconn "$p") > HAPROXY_MAX_SERVER_CONN)); then
        HAPROXY_MAX_SERVER_CONN=$(peer_maxconn "$p")
    fi
done
dup=$(printf '%s\n' "${PEER_LIST[@]}" | sort | uniq -d | head -n1)
[[ -z $dup ]] || die "peer '$dup' appears twice in PEERS"

# ---------------------------------------------------------------- tools
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
install_missing "nodejs nginx-light haproxy apache2-utils" node nginx haproxy ab
require node nginx haproxy ab curl taskset ss awk sort getconf
if [[ " ${PEER_LIST[*]} " == *" pinlb"* ]]; then
    [[ -x $PINLB ]] || die "pinlb binary not found at $PINLB (build it: cargo build --release, or set PINLB=..., or PEERS=\"nginx haproxy-32\")"
    "$PINLB" --version >/dev/null 2>&1 || die "'$PINLB --version' failed"
fi
NCPU=$(nproc)
((NCPU >= 2)) || die "need at least 2 cores (0 and 1); nproc=$NCPU"
HZ=$(getconf CLK_TCK)

# Open files: ab holds C sockets, a proxy C client sockets plus its backend ones.
HARD_NOFILE=$(ulimit -Hn)
if [[ $HARD_NOFILE != unlimited ]] && ((HARD_NOFILE < NOFILE)); then NOFILE=$HARD_NOFILE; fi
ulimit -n "$NOFILE" || die "ulimit -n $NOFILE failed (hard limit $HARD_NOFILE)"
((NOFILE >= MAX_C + 100)) || die "ulimit -n is $NOFILE: too low for C=$MAX_C (needs C + 100; raise the hard limit or lower CONCURRENCY)"
NGINX_CONNS=$((NOFILE - 100))
# HAProxy wants about 2 fds per maxconn: as many connections as the limit allows.
HAPROXY_MAXCONN=$(((NOFILE - 200) / 2))
((HAPROXY_MAXCONN >= MAX_C + 3 * HAPROXY_MAX_SERVER_CONN)) ||
    log "WARNING: HAProxy maxconn $HAPROXY_MAXCONN (from ulimit -n $NOFILE) is below C=$MAX_C + backend connections"

# ---------------------------------------------------------------- cleanup
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pinlb-overload.XXXXXX")
chmod 755 "$WORK" # nginx workers may run as an unprivileged user when root
PIDS=()           # the proxies
NODE_PIDS=()
GEN_PID=""   # ab while it runs
PROBE_PID="" # a pinlb peer's trial start
running_pids() { echo "$GEN_PID" "$PROBE_PID" "${PIDS[@]}" "${NODE_PIDS[@]}"; }
install_cleanup

# ---------------------------------------------------------------- helpers
# render TEMPLATE DEST PORT DIR [MAXCONN, default $MAXCONN]
render() {
    sed -e "s|@DIR@|$4|g" -e "s|@PORT@|$3|g" -e "s|@NODE0@|${NODE_PORTS[0]}|g" \
        -e "s|@NODE1@|${NODE_PORTS[1]}|g" -e "s|@NODE2@|${NODE_PORTS[2]}|g" \
        -e "s|@MAXCONN@|${5:-$MAXCONN}|g" -e "s|@NOFILE@|$NOFILE|g" -e "s|@NGINX_CONNS@|$NGINX_CONNS|g" \
        -e "s|@HAPROXY_MAXCONN@|$HAPROXY_MAXCONN|g" "$1" >"$2"
}

toml_of() { echo "$PEERS_DIR/$1.toml"; } # pinlb -> pinlb.toml, pinlb-queue -> pinlb-queue.toml

# pinlb_takes P: 0 when $PINLB takes peer P's configuration: `pinlb check` passes and a trial
# start answers within 5 s. Otherwise 1, with SKIP_WHY[P] saying why.
# shellcheck disable=SC2034 # SKIP_WHY is read in the report
pinlb_takes() {
    local p=$1 d="$WORK/$1-probe" i why=""
    mkdir -p "$d"
    render "$(toml_of "$p")" "$d/pinlb.toml" "${PORT[$p]}" "$d"
    if ! "$PINLB" check -c "$d/pinlb.toml" >"$d/check.log" 2>&1; then
        why=$(grep -m1 -iE 'error|unknown|invalid' "$d/check.log" || head -n1 "$d/check.log")
        why=${why#"$d/pinlb.toml:"}
        why=${why%%, expected*}
        SKIP_WHY[$p]="\`pinlb check\` rejects benches/peers/overload/$p.toml: $why"
        return 1
    fi
    RUST_LOG=warn taskset -c 0 "$PINLB" serve -c "$d/pinlb.toml" >"$d/serve.log" 2>&1 &
    PROBE_PID=$!
    for ((i = 0; i < 50; i++)); do
        if ! kill -0 "$PROBE_PID" 2>/dev/null; then
            wait "$PROBE_PID" 2>/dev/null || true
            PROBE_PID=""
            why=$(grep -m1 -iE 'error|unknown|invalid' "$d/serve.log" || tail -n1 "$d/serve.log")
            SKIP_WHY[$p]="pinlb exits at start-up with benches/peers/overload/$p.toml: $why"
            return 1
        fi
        [[ $(curl -s --max-time 1 "http://127.0.0.1:${PORT[$p]}/" 2>/dev/null) == "hello world" ]] && break
        sleep 0.1
    done
    stop_all "$PROBE_PID"
    wait "$PROBE_PID" 2>/dev/null || true
    PROBE_PID=""
    ((i < 50)) || {
        SKIP_WHY[$p]="pinlb with benches/peers/overload/$p.toml did not answer within 5 s of its start (log: $d/serve.log)"
        return 1
    }
    for ((i = 0; i < 50; i++)); do
        port_in_use "${PORT[$p]}" || return 0
        sleep 0.1
    done
    die "port ${PORT[$p]} still in use 5 s after $p's trial start stopped"
}

# start_one P: starts peer P. haproxy-N is started here (lib.sh's start_peer knows only one
# `haproxy`, at $MAXCONN), as start_peer starts haproxy but with maxconn N per server; the
# others with start_peer.
# shellcheck disable=SC2034 # VERSION is read by describe_procs and the report
start_one() {
    local p=$1 d="$WORK/$1"
    case $p in
    haproxy | haproxy-*)
        mkdir -p "$d"
        LOGF[$p]="$d/stdout.log"
        render "$PEERS_DIR/haproxy.cfg" "$d/haproxy.cfg" "${PORT[$p]}" "$d" "$(peer_maxconn "$p")"
        taskset -c 0 haproxy -db -f "$d/haproxy.cfg" >"${LOGF[$p]}" 2>&1 &
        PID_OF[$p]=$!
        VERSION[$p]=$(haproxy -v 2>&1 | awk 'NR == 1 {print $3}')
        PIDS+=("${PID_OF[$p]}")
        wait_ready "$p" "${PORT[$p]}" "${PID_OF[$p]}" "${LOGF[$p]}"
        ;;
    *) start_peer "$p" "$(toml_of "$p")" ;;
    esac
}

# takes_adaptive: whether $PINLB knows issue 47's keys (`pinlb check` takes adaptive = true on
# a copy of pinlb.toml): "yes" or "no".
takes_adaptive() {
    local d="$WORK/adaptive-probe"
    mkdir -p "$d"
    render "$PEERS_DIR/pinlb.toml" "$d/pinlb.toml" "${PORT[pinlb]:-$PORT_BASE}" "$d"
    sed -i 's|^algorithm = "least_conn"$|&\nadaptive = true|' "$d/pinlb.toml"
    grep -q '^adaptive = true$' "$d/pinlb.toml" || die "could not add adaptive = true to $d/pinlb.toml"
    if "$PINLB" check -c "$d/pinlb.toml" >"$d/check.log" 2>&1; then echo yes; else echo no; fi
}

# conn_counts: "LIVE TW" on the proxies' and backends' ports. LIVE counts what is still
# going on from a run: client connections to a proxy in any state but TIME-WAIT; backend
# connections being opened, or established with bytes queued (a request not yet read or an
# answer not yet taken); a listening socket with connections waiting to be accepted. Idle
# pooled backend connections are not counted (nor those half-closed by an idle timeout, which
# a pool may hold in CLOSE-WAIT until it next looks at them). TW: TIME-WAIT on those ports.
conn_counts() {
    ss -tanH 2>/dev/null | awk -v pp=" ${PROXY_PORTS[*]} " -v np=" ${NODE_PORTS[*]} " '
        function on(list, port) { return index(list, " " port " ") > 0 }
        { l = $4; sub(/.*:/, "", l); r = $5; sub(/.*:/, "", r)
          proxy = on(pp, l) || on(pp, r); node = on(np, l) || on(np, r)
          if (!proxy && !node) next
          if ($1 == "LISTEN") { if ($2 > 0) live++; next }
          if ($1 == "TIME-WAIT") { tw++; next }
          if (proxy) { live++; next }
          if ($1 ~ /^SYN-/ || ($1 == "ESTAB" && $2 + $3 > 0)) live++ }
        END { print live + 0, tw + 0 }'
}

# drain: wait (bounded: DRAIN_S s) until conn_counts sees nothing live and at most DRAIN_TW in
# TIME-WAIT; sets DRAIN_NOTE.
drain() {
    local i live tw n=$((DRAIN_S * 2))
    for ((i = 0; i <= n; i++)); do
        read -r live tw < <(conn_counts)
        if ((live == 0 && tw <= DRAIN_TW)); then
            DRAIN_NOTE="drained in $((i / 2)).$((i % 2 * 5)) s ($tw in TIME-WAIT)"
            return 0
        fi
        if ((i < n)); then sleep 0.5; fi
    done
    DRAIN_NOTE="not drained after $DRAIN_S s: $live live, $tw in TIME-WAIT"
    # TIME-WAIT lasts 60 s: after a busy run only the bound ends the wait; worth a warning
    # only when connections are still live.
    if ((live > 0)); then log "WARNING: $DRAIN_NOTE; going on"; else log "$DRAIN_NOTE; going on"; fi
}

# task_jiffies: user+nice+system jiffies of cores 0 and 1 (/proc/stat): time in tasks, not
# in interrupts, so that it can be set against the processes' utime+stime.
task_jiffies() {
    awk '$1 == "cpu0" || $1 == "cpu1" { s += $2 + $3 + $4 } END { print s + 0 }' /proc/stat
}

# other_pct J0 J1 TASK_JIFFIES OURS_TICKS AB_SECONDS: the % of cores 0 and 1 (over the run,
# from two core_jiffies snapshots) that tasks other than the proxy, the backends and ab used:
# another program (a compiler) sharing the cores, which makes the run's numbers noisy.
other_pct() {
    awk -v a="$1" -v b="$2" -v t="$3" -v o="$4" -v ab="$5" -v hz="$HZ" 'BEGIN {
        split(a, x, " "); split(b, y, " "); tot = y[2] - x[2] + y[4] - x[4]
        v = (tot > 0) ? 100 * (t - o - ab * hz) / tot : 0
        printf "%.0f\n", (v > 0) ? v : 0
    }'
}

# ensure_up P: restarts peer P only if it died; then polls it until it answers (bounded).
ensure_up() {
    local p=$1
    if ! kill -0 "${PID_OF[$p]}" 2>/dev/null; then
        log "WARNING: $p (pid ${PID_OF[$p]}) died; its log: ${LOGF[$p]}; restarting it"
        tail -n 20 "${LOGF[$p]}" >&2 2>/dev/null || true
        RESTARTS[$p]=$((${RESTARTS[$p]:-0} + 1))
        stop_all "${PID_OF[$p]}"
        start_one "$p"
    fi
    wait_ready "$p" "${PORT[$p]}" "${PID_OF[$p]}" "${LOGF[$p]}"
}

# ---------------------------------------------------------------- start
read -r IDLE_BUSY0 IDLE_BUSY1 < <(core_busy_1s)
declare -A PORT PID_OF VERSION LOGF SKIP_WHY RESTARTS
NODE_PORTS=()
for i in 0 1 2; do
    pick_port
    NODE_PORTS+=("$PICKED")
done
for p in "${PEER_LIST[@]}"; do
    pick_port
    PORT[$p]=$PICKED
done
PROXY_PORTS=()
for p in "${PEER_LIST[@]}"; do PROXY_PORTS+=("${PORT[$p]}"); done
log "work dir $WORK; backends 127.0.0.1:${NODE_PORTS[*]}; ulimit -n $NOFILE"

for i in 0 1 2; do
    PORT=${NODE_PORTS[$i]} BUSY_LOOP=$BUSY_LOOP taskset -c 1 node "$PEERS_DIR/node-busy.js" \
        >"$WORK/node$i.log" 2>&1 &
    NODE_PIDS+=("$!")
    wait_ready "node$i" "${NODE_PORTS[$i]}" "$!" "$WORK/node$i.log"
done

RUN_PEERS=()
for p in "${PEER_LIST[@]}"; do
    if [[ $p == pinlb-queue && $PINLB_QUEUE == 0 ]]; then
        SKIP_WHY[$p]="PINLB_QUEUE=0"
        log "skipping pinlb-queue: PINLB_QUEUE=0"
        continue
    fi
    if [[ $p == pinlb* ]] && ! pinlb_takes "$p"; then
        log "skipping $p: ${SKIP_WHY[$p]}"
        continue
    fi
    start_one "$p"
    RUN_PEERS+=("$p")
done
((${#RUN_PEERS[@]} > 0)) || die "no peer left to run"

# ---------------------------------------------------------------- header
host_facts
PINLB_ADAPTIVE=""
if [[ " ${PEER_LIST[*]} " == *" pinlb"* ]]; then PINLB_ADAPTIVE=$(takes_adaptive); fi

# peer_desc P: what peer P is, in one line (the report's and the log's).
peer_desc() {
    case $1 in
    pinlb)
        echo -n "pinlb defaults: least_conn and the three backends, no other key set; "
        if [[ $PINLB_ADAPTIVE == yes ]]; then
            echo "this binary takes issue 47's \`adaptive\`, so that is a learned concurrency limit per backend (adaptive_min 2, adaptive_max 1000) and a queue"
        else
            echo "this binary predates issue 47 (\`pinlb check\` rejects \`adaptive = true\`): no limit per backend and no queue"
        fi
        ;;
    pinlb-queue) echo "pinlb hand-tuned: max_conns = $MAXCONN per backend (fixed: no learned limit), queue = 10000, timeouts.queue = \"30s\"" ;;
    nginx) echo "nginx: least_conn, keepalive 64; no limit per backend and no queue (open-source nginx has neither)" ;;
    haproxy*) echo "HAProxy hand-tuned: balance leastconn, maxconn $(peer_maxconn "$1") per server, timeout queue 30s (maxqueue unlimited)" ;;
    esac
}
NODE_VERSION=$(node --version)
AB_VERSION=$(ab -V 2>&1 | awk 'NR == 1 {print $5}' || true)
ENV_LINE="CONCURRENCY=\"$CONCURRENCY\" DURATION=$DURATION ROUNDS=$ROUNDS MAXCONN=$MAXCONN PEERS=\"$PEERS\" PINLB_QUEUE=$PINLB_QUEUE"
if [[ " ${PEER_LIST[*]} " == *" pinlb"* ]]; then ENV_LINE+=" PINLB=$PINLB"; fi
echo "== overload: ab -c ${CONC_LIST[*]} through a proxy to 3 Node.js processes with a busy loop =="
echo "command:   $ENV_LINE $CMDLINE"
echo "nproc:     $NCPU ($CPU_MODEL); commit $COMMIT; node $NODE_VERSION; ab $AB_VERSION; ulimit -n $NOFILE"
echo "topology:  core 0: the proxy (one worker); core 1: 3 node processes ${NODE_PORTS[*]} + taskset -c 1 ab -q -r -s 30 -c C -t $DURATION -n $AB_REQUESTS URL"
describe_procs "${RUN_PEERS[@]}"
for p in "${RUN_PEERS[@]}"; do echo "           $p: $(peer_desc "$p")"; done
for p in "${PEER_LIST[@]}"; do
    if [[ -n ${SKIP_WHY[$p]:-} ]]; then echo "           $p skipped: ${SKIP_WHY[$p]}"; fi
done

# ---------------------------------------------------------------- runs
RAW="$WORK/raw.tsv" # round peer C complete lost rps p50 p99 cpu_us failed connect receive length exceptions non2xx failed+non2xx busy0 busy1 other ab_rc drain
: >"$RAW"
NRUNS=$((ROUNDS * ${#CONC_LIST[@]} * ${#RUN_PEERS[@]}))
run_no=0
OTHER_BUSY=0
# The kernel threads that run the loopback traffic's softirqs when they pile up: the test's
# own work, not another program's.
mapfile -t KSOFTIRQD < <(ps -eo pid=,comm= | awk '$2 == "ksoftirqd/0" || $2 == "ksoftirqd/1" {print $1}')
for ((r = 1; r <= ROUNDS; r++)); do
    for c in "${CONC_LIST[@]}"; do
        for p in "${RUN_PEERS[@]}"; do
            run_no=$((run_no + 1))
            drain
            ensure_up "$p"
            out="$WORK/ab-$r-$c-$p.txt"
            mapfile -t tree < <(proc_tree "${PID_OF[$p]}")
            t0=$(cpu_ticks "${tree[@]}")
            n0=$(cpu_ticks "${NODE_PIDS[@]}" "${KSOFTIRQD[@]}")
            u0=$(task_jiffies)
            j0=$(core_jiffies)
            ab_rc=0
            # Nothing may start a child between the two child_times (its CPU would count as ab's).
            child_times
            ab_before=$CHILD_TIMES
            taskset -c 1 ab -q -r -s 30 -c "$c" -t "$DURATION" -n "$AB_REQUESTS" \
                "http://127.0.0.1:${PORT[$p]}/" >"$out" 2>&1 &
            GEN_PID=$!
            wait "$GEN_PID" || ab_rc=$?
            GEN_PID=""
            child_times
            j1=$(core_jiffies)
            u1=$(task_jiffies)
            t1=$(cpu_ticks "${tree[@]}")
            n1=$(cpu_ticks "${NODE_PIDS[@]}" "${KSOFTIRQD[@]}")
            read -r busy0 busy1 < <(core_busy "$j0" "$j1")
            other=$(other_pct "$j0" "$j1" $((u1 - u0)) $((t1 - t0 + n1 - n0)) "$(cpu_s_between "$ab_before" "$CHILD_TIMES")")
            if ((other > 10)); then
                OTHER_BUSY=1
                log "WARNING: ${other}% of cores 0 and 1 went to other programs during this run: its numbers are noisy"
            fi
            kill -0 "${PID_OF[$p]}" 2>/dev/null || log "WARNING: $p died during the run (C=$c)"
            # One tab-separated line of ab's figures; "nan" for what ab did not print (it prints
            # no statistics when it aborts, e.g. after 10 connect errors).
            IFS=$'\t' read -r complete failed conn recv len exc non2xx rps p50 p99 < <(awk '
                /^Complete requests:/ { complete = $3 }
                /^Failed requests:/ { failed = $3 }
                /^ *\(Connect:/ { gsub(/[(),]/, ""); conn = $2; recv = $4; len = $6; exc = $8 }
                /^Non-2xx responses:/ { non2xx = $3 }
                /^Requests per second:/ { rps = $4 }
                $1 == "50%" { p50 = $2 }
                $1 == "99%" { p99 = $2 }
                END {
                    d = "nan"
                    printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", (complete == "" ? d : complete),
                        (failed == "" ? d : failed), (conn == "" ? 0 : conn), (recv == "" ? 0 : recv),
                        (len == "" ? 0 : len), (exc == "" ? 0 : exc), (non2xx == "" ? 0 : non2xx),
                        (rps == "" ? d : rps), (p50 == "" ? d : p50), (p99 == "" ? d : p99)
                }' "$out")
            if [[ $complete == nan ]]; then
                log "WARNING: ab printed no results for $p at C=$c (rc=$ab_rc); its output:"
                tail -n 5 "$out" >&2 || true
                lost=nan
                ab_sum=nan
                cpu_us=nan
            else
                # Each lost request once (see the header); len beyond non2xx + recv: 2xx answers
                # with a wrong body.
                extra_len=$((len - non2xx - recv))
                ((extra_len > 0)) || extra_len=0
                lost=$((non2xx + conn + recv + exc + extra_len))
                ab_sum=$((failed + non2xx))
                doclen=$(awk '/^Document Length:/ {print $3; exit}' "$out")
                [[ $doclen == 11 ]] || log "WARNING: ab's first response from $p at C=$c had a ${doclen:-?}-byte body, not 11: its Length failures count the good answers; lost is unreliable for this run"
                cpu_us=$(awk -v t=$((t1 - t0)) -v hz="$HZ" -v n="$complete" 'BEGIN { if (n > 0) printf "%.1f\n", t / hz * 1e6 / n; else print "nan" }')
            fi
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
                "$r" "$p" "$c" "$complete" "$lost" "$rps" "$p50" "$p99" "$cpu_us" "$failed" \
                "$conn" "$recv" "$len" "$exc" "$non2xx" "$ab_sum" "$busy0" "$busy1" "$other" "$ab_rc" "$DRAIN_NOTE" >>"$RAW"
            log "run $run_no/$NRUNS round $r C=$c $p: $complete complete, $lost lost (ab failed $failed: connect $conn receive $recv length $len exceptions $exc; non-2xx $non2xx), $rps req/s, p50 $p50 ms, p99 $p99 ms, proxy $cpu_us us CPU/req, core0 ${busy0}% core1 ${busy1}% (other programs ${other}%); $DRAIN_NOTE"
        done
    done
done

# ---------------------------------------------------------------- report
# med PEER C COLUMN: the median of that column of $RAW over the rounds ("nan" values skipped).
med() {
    awk -F'\t' -v p="$1" -v c="$2" -v k="$3" '$2 == p && $3 == c && $k != "nan" {print $k}' "$RAW" | sort -g |
        awk '{ a[NR] = $1 } END {
            if (NR == 0) { print "nan"; exit }
            print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
        }'
}

# worst PEER C COLUMN: the largest value of that column of $RAW over the rounds ("nan" skipped).
worst() {
    awk -F'\t' -v p="$1" -v c="$2" -v k="$3" '$2 == p && $3 == c && $k != "nan" {print $k}' "$RAW" | sort -g |
        awk 'END { print (NR ? $1 : "nan") }'
}

# ratio A B BAR: A / B to 2 decimals and a check mark against BAR ("<=X" or ">=X"); "n/a" when
# either is missing or B is 0.
ratio() {
    awk -v a="$1" -v b="$2" -v bar="$3" 'BEGIN {
        if (a == "nan" || b == "nan" || a == "" || b == "" || b + 0 == 0) { print "n/a"; exit }
        r = a / b; lim = substr(bar, 3) + 0
        ok = (substr(bar, 1, 2) == "<=") ? (sprintf("%.2f", r) + 0 <= lim) : (sprintf("%.2f", r) + 0 >= lim)
        printf "%.2f %s\n", r, (ok ? "✓" : "✗")
    }'
}

# bars_section: issue 47's bars per pinlb peer and C, from the medians (lost: the most in a
# round): p99 / haproxy-32's p99 <= 1.1, lost = 0, req/s / nginx's req/s >= 1.1.
bars_section() {
    local p c ref="" nginx="" lost lost_cell
    if [[ " ${RUN_PEERS[*]} " == *" haproxy-32 "* ]]; then
        ref=haproxy-32
    elif [[ " ${RUN_PEERS[*]} " == *" haproxy "* && $MAXCONN == 32 ]]; then
        ref=haproxy
    fi
    [[ " ${RUN_PEERS[*]} " != *" nginx "* ]] || nginx=nginx
    echo
    echo "Issue 47's bars, per pinlb peer and concurrency, from the medians above (lost: the most in one round): p99 ÷ HAProxy maxconn 32's p99 (bar ≤ 1.1), lost (bar 0), req/s ÷ nginx's req/s (bar ≥ 1.1). ✓ meets the bar, ✗ misses it. The bars are for pinlb's defaults (the pinlb rows)$([[ " ${RUN_PEERS[*]} " == *" pinlb-queue "* ]] && echo "; pinlb-queue's rows show where hand-tuning puts pinlb")."
    if [[ -z $ref ]]; then echo "HAProxy maxconn 32 was not run (PEERS has no haproxy-32): its column is n/a."; fi
    if [[ -z $nginx ]]; then echo "nginx was not run: its column is n/a."; fi
    echo
    echo "| peer | concurrency | p99 ÷ haproxy-32's p99 (≤ 1.1) | lost (0) | req/s ÷ nginx's req/s (≥ 1.1) |"
    echo "|---|---:|---:|---:|---:|"
    for p in "${RUN_PEERS[@]}"; do
        [[ $p == pinlb* ]] || continue
        for c in "${CONC_LIST[@]}"; do
            lost=$(worst "$p" "$c" 5)
            case $lost in nan) lost_cell="n/a" ;; 0) lost_cell="0 ✓" ;; *) lost_cell="$lost ✗" ;; esac
            printf '| %s | %s | %s | %s | %s |\n' "$p" "$c" \
                "$(if [[ -n $ref ]]; then ratio "$(med "$p" "$c" 8)" "$(med "$ref" "$c" 8)" "<=1.1"; else echo n/a; fi)" \
                "$lost_cell" \
                "$(if [[ -n $nginx ]]; then ratio "$(med "$p" "$c" 6)" "$(med nginx "$c" 6)" ">=1.1"; else echo n/a; fi)"
        done
    done
}

MD="$WORK/report.md"
{
    echo "### Overload (issues 27 and 47): ab -c ${CONC_LIST[*]} through a proxy to 3 busy Node.js processes ($(date -u '+%Y-%m-%d %H:%M UTC'), commit $COMMIT)"
    echo
    echo "- Command: \`$ENV_LINE $CMDLINE\`"
    echo "- Host: nproc=$NCPU, $CPU_MODEL, $(uname -sr); ulimit -n $NOFILE; before start core0 ${IDLE_BUSY0}% / core1 ${IDLE_BUSY1}% busy"
    echo -n "- Versions:"
    shown=" "
    for p in "${RUN_PEERS[@]}"; do
        prog=${p%%-*} # pinlb-queue runs pinlb, haproxy-N haproxy
        [[ $shown == *" $prog "* ]] && continue
        shown+="$prog "
        echo -n " $prog ${VERSION[$p]};"
    done
    echo " node $NODE_VERSION; ab $AB_VERSION"
    echo "- Topology: the proxy on core 0 (one worker); 3 Node.js processes (\`http.createServer\`, a ${BUSY_LOOP}-iteration busy loop per request) and \`taskset -c 1 ab -r -s 30 -c C -t $DURATION -n $AB_REQUESTS\` (no keep-alive) on core 1. Configs: \`benches/peers/overload/\`."
    echo "- Peers:"
    for p in "${RUN_PEERS[@]}"; do echo "  - **$p**: $(peer_desc "$p")"; done
    echo "- $ROUNDS round(s), interleaved per concurrency (each peer in turn); $([[ $ROUNDS -gt 1 ]] && echo "medians over rounds" || echo "one run each"). Lost = requests not answered 2xx, each once: ab's Non-2xx + its Connect, Receive and Exceptions failures + Length failures beyond those (ab counts a 503 under both Non-2xx and Length, so its Failed + Non-2xx, in the per-run section, counts most lost requests twice). CPU = the proxy's utime+stime over the run / complete requests."
    for p in "${PEER_LIST[@]}"; do
        if [[ -n ${SKIP_WHY[$p]:-} ]]; then echo "- **$p skipped**: ${SKIP_WHY[$p]}"; fi
    done
    for p in "${RUN_PEERS[@]}"; do
        if [[ -n ${RESTARTS[$p]:-} ]]; then echo "- **$p died and was restarted ${RESTARTS[$p]} time(s)** (log: ${LOGF[$p]})"; fi
    done
    if ((OTHER_BUSY)); then
        echo "- **Warning:** other programs took over 10% of cores 0 and 1 during some runs (the per-run section's \"other programs %\": busy jiffies in /proc/stat less the proxy's, the backends' and ab's CPU time): those numbers are noisy."
    fi
    if ((IDLE_BUSY0 > 10 || IDLE_BUSY1 > 10)); then
        echo "- **Warning:** the cores were busy before the start (core0 ${IDLE_BUSY0}%, core1 ${IDLE_BUSY1}%): another program was running; these numbers are noisy."
    fi
    echo
    echo "| peer | concurrency | complete | lost | req/s | p50 ms | p99 ms | proxy CPU µs/req |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    for p in "${RUN_PEERS[@]}"; do
        for c in "${CONC_LIST[@]}"; do
            printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$p" "$c" "$(med "$p" "$c" 4)" \
                "$(med "$p" "$c" 5)" "$(awk -v v="$(med "$p" "$c" 6)" 'BEGIN { if (v == "nan") print v; else printf "%.0f\n", v }')" \
                "$(med "$p" "$c" 7)" "$(med "$p" "$c" 8)" "$(med "$p" "$c" 9)"
        done
    done
    bars_section
    raw_section "Per run (round, peer, C, complete, lost, req/s, p50 ms, p99 ms, proxy µs/req, ab Failed, of which connect, receive, length, exceptions; ab Non-2xx; ab Failed + Non-2xx, core0 %, core1 %, other programs % of both cores, ab rc, drain before):"
} >"$MD"
publish_report "$MD"
