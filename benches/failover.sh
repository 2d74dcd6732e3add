#!/usr/bin/env bash
# benches/failover.sh - how pinlb, nginx and HAProxy ride out a backend crash:
# one of three backends is killed during a wrk run and restarted later; count
# the requests that failed, the p99 latency, and whether the restarted backend
# gets traffic again. One run, interleaved rounds.
#
# Topology (meant for a 2-core machine):
#   core 0: the proxy under test, ONE worker (`taskset -c 0`; nginx
#           worker_processes 1, haproxy nbthread 1, pinlb [runtime] cpus = [0]),
#           round robin over three backends, up to 64 keep-alive connections.
#   core 1: three backends (separate nginx processes, worker_processes 1, each
#           answering `200 "hello world\n"` on every path, /health included)
#           AND the load generator (`wrk -t1 -c$CONNS -d$DURATION --latency`).
#   Failover settings (benches/peers/failover/*, rendered into a mktemp -d dir):
#   nginx   passive only: max_fails=1 fail_timeout=10s, proxy_next_upstream
#           error timeout http_502 http_503, proxy_connect_timeout 1s
#   haproxy active checks GET /health inter 2s fall 3 rise 2, retries 3,
#           option redispatch, retry-on all-retryable-errors, timeout connect 1s
#   pinlb   [upstream.app.health] (the same checks as HAProxy), [passive]
#           (the same as nginx), [retry], timeouts.connect 1s
#
# Procedure: the backends and every proxy in $PEERS are started once and polled
# (curl, bounded loops) until they answer. Backend $VICTIM runs in its own
# process group (setsid). For each of $ROUNDS rounds, each proxy in $PEERS
# order (pinlb, nginx, haproxy, pinlb, ...):
#   1. poll through the proxy until a request reaches the victim again (the
#      proxy has readmitted it after the previous round; bounded, 15 s), then
#      an unrecorded warm-up wrk run ($WARMUP);
#   2. the recorded wrk run ($DURATION); at $KILL_AT s the victim's process
#      group (master + worker) gets SIGKILL - a crash, connections reset - and
#      at $RESTART_AT s it is started again on the same port (after polling
#      until the port is free) and polled until it answers.
#
# Measured per round and proxy:
#   failed       wrk socket errors (connect+read+write+timeout; wrk's timeout
#                is 2 s) + "Non-2xx or 3xx responses"
#   requests     requests wrk completed; req/s = wrk "Requests/sec"
#   p99, max     wrk --latency 99% line and Latency max, in microseconds
#   readmitted   requests of wrk's (path "/") the victim answered after its
#                restart, counted in its access log (one line per request)
# Summary: per proxy the median over rounds of failed requests, p99, req/s and
# readmitted requests, against the target: pinlb with zero failed requests and
# a p99 no worse than the best peer's. Printed as Markdown and written to
# $OUT_MD, with the command line and nproc.
#
# Usage (from anywhere; root or not):
#   bash benches/failover.sh
#   PEERS="nginx haproxy" ROUNDS=1 bash benches/failover.sh
# Environment:
#   ROUNDS=3            recorded rounds per proxy
#   DURATION=20s        wrk duration of each recorded run (whole seconds)
#   KILL_AT=5           seconds into the run when the victim is killed
#   RESTART_AT=12       seconds into the run when it is restarted
#   VICTIM=2            which backend (1-3) is killed
#   CONNS=64            wrk connections (-c); wrk always uses one thread (-t1)
#   WARMUP=1s           unrecorded wrk run before each recorded run; 0 = none
#   PEERS="pinlb nginx haproxy"   proxies to run, in this order
#   PINLB=target/release/pinlb    pinlb binary (relative to the repo root)
#   PINLB_TOML=benches/peers/failover/pinlb.toml   pinlb config template
#   OUT_MD=/tmp/pinlb-failover.md where the Markdown report is written
#   PORT_BASE=18180     ports: the first free loopback ports >= PORT_BASE
#                       (checked with `ss -ltn`): backends 1-3, then PEERS
#   KEEP_TMP=0          1 = keep the temp dir (configs, logs, wrk outputs)
# Needs: nginx, haproxy, wrk (installed with apt-get if missing and root),
# curl, taskset, setsid, ss, awk.
#
# Don't run it while something else is busy on the machine (e.g. cargo build):
# both cores are part of the measurement. Both cores are sampled for 1 s
# before anything starts and a warning is printed (and put in the report) if
# either is >10% busy.

set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_DIR="$ROOT/benches/peers/failover"
CMDLINE="bash $0${*:+ $*}"

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-20s}
KILL_AT=${KILL_AT:-5}
RESTART_AT=${RESTART_AT:-12}
VICTIM=${VICTIM:-2}
CONNS=${CONNS:-64}
WARMUP=${WARMUP:-1s}
PEERS=${PEERS:-pinlb nginx haproxy}
PINLB=${PINLB:-target/release/pinlb}
PINLB_TOML=${PINLB_TOML:-benches/peers/failover/pinlb.toml}
OUT_MD=${OUT_MD:-/tmp/pinlb-failover.md}
PORT_BASE=${PORT_BASE:-18180}
KEEP_TMP=${KEEP_TMP:-0}

case $PINLB in /*) ;; *) PINLB="$ROOT/$PINLB" ;; esac
case $PINLB_TOML in /*) ;; *) PINLB_TOML="$ROOT/$PINLB_TOML" ;; esac
PATH="$PATH:/usr/sbin:/sbin"

log() { printf '[failover] %s\n' "$*" >&2; }
die() { printf '[failover] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer (got '$ROUNDS')"
[[ $CONNS =~ ^[1-9][0-9]*$ ]] || die "CONNS must be a positive integer (got '$CONNS')"
[[ $PORT_BASE =~ ^[0-9]+$ ]] || die "PORT_BASE must be a number (got '$PORT_BASE')"
[[ $DURATION =~ ^([1-9][0-9]*)s?$ ]] || die "DURATION must be whole seconds, e.g. 20s (got '$DURATION')"
DUR_S=${BASH_REMATCH[1]}
[[ $VICTIM =~ ^[123]$ ]] || die "VICTIM must be 1, 2 or 3 (got '$VICTIM')"
for v in "$KILL_AT" "$RESTART_AT"; do
    [[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "KILL_AT and RESTART_AT must be seconds (got '$v')"
done
awk -v k="$KILL_AT" -v r="$RESTART_AT" -v d="$DUR_S" 'BEGIN { exit !(0 < k && k < r && r < d) }' ||
    die "need 0 < KILL_AT ($KILL_AT) < RESTART_AT ($RESTART_AT) < DURATION ($DUR_S)"
read -r -a PEER_LIST <<<"$PEERS"
((${#PEER_LIST[@]} > 0)) || die "PEERS is empty"
for p in "${PEER_LIST[@]}"; do
    case $p in pinlb | nginx | haproxy) ;; *) die "unknown peer '$p' (known: pinlb nginx haproxy)" ;; esac
done

# ---------------------------------------------------------------- tools
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
install_missing "nginx-light haproxy wrk" nginx haproxy wrk
require nginx haproxy wrk curl taskset setsid ss awk sort grep
if [[ " ${PEER_LIST[*]} " == *" pinlb "* ]]; then
    [[ -x $PINLB ]] || die "pinlb binary not found at $PINLB (build it: cargo build --release, or set PINLB=..., or PEERS=\"nginx haproxy\")"
    "$PINLB" --version >/dev/null 2>&1 || die "'$PINLB --version' failed"
    [[ -r $PINLB_TOML ]] || die "pinlb config template not found: $PINLB_TOML"
fi
[[ -n ${EPOCHREALTIME:-} ]] || die "bash 5 needed (EPOCHREALTIME)"

NCPU=$(nproc)
((NCPU >= 2)) || die "need at least 2 cores (0 and 1); nproc=$NCPU"

# ---------------------------------------------------------------- cleanup
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pinlb-failover.XXXXXX")
chmod 755 "$WORK" # nginx workers may run as an unprivileged user when root
PIDS=()           # the proxies
BPID=()           # backend i (1-3): pid of its nginx master = its process group
WRK_PID=""

running_pids() { echo "$WRK_PID" "${PIDS[@]}" "${BPID[@]}"; }

# ---------------------------------------------------------------- helpers
install_cleanup

# render TEMPLATE DEST PORT DIR
render() {
    sed -e "s|@DIR@|$4|g" -e "s|@PORT@|$3|g" -e "s|@BACKEND_PORT@|$3|g" \
        -e "s|@B1@|${BPORT[1]}|g" -e "s|@B2@|${BPORT[2]}|g" -e "s|@B3@|${BPORT[3]}|g" "$1" >"$2"
}

# start_backend I: (re)start backend I on core 1 in its own process group.
start_backend() {
    local d="$WORK/b$1"
    taskset -c 1 setsid nginx -p "$d" -c "$d/nginx.conf" -e "$d/error.log" >>"$d/stdout.log" 2>&1 &
    BPID[$1]=$!
    wait_ready "backend $1" "${BPORT[$1]}" "${BPID[$1]}" "$d/error.log" /ready
    [[ $(ps -o pgid= -p "${BPID[$1]}" | tr -d ' ') == "${BPID[$1]}" ]] ||
        die "backend $1 (pid ${BPID[$1]}) is not a process group leader"
}

# Crash backend I: SIGKILL to its process group (master + worker), reap the
# master, poll until its port is free (bounded).
kill_backend() {
    local i
    kill -KILL -- "-${BPID[$1]}" 2>/dev/null || true
    wait "${BPID[$1]}" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        port_in_use "${BPORT[$1]}" || return 0
        sleep 0.1
    done
    die "port ${BPORT[$1]} of backend $1 still in use 5 s after SIGKILL"
}

# wrk requests ("/") in an access log; 0 when there is none yet.
served() {
    local n
    n=$(grep -cx / "$1" 2>/dev/null) || true
    echo "${n:-0}"
}

# Poll through proxy PEER (3 requests per try: one per backend under round
# robin) until one reaches the victim; bounded, 15 s.
readmitted() {
    local url="http://127.0.0.1:${PORT[$1]}/" i n0
    n0=$(served "$VLOG")
    for ((i = 0; i < 150; i++)); do
        curl -s --max-time 1 "$url" "$url" "$url" >/dev/null || true
        (($(served "$VLOG") > n0)) && return 0
        sleep 0.1
    done
    return 1
}

since() { awk -v t0="$1" -v n="$EPOCHREALTIME" 'BEGIN { printf "%.2f\n", n - t0 }'; }
sleep_until() { # T0 OFFSET
    sleep "$(awk -v t0="$1" -v o="$2" -v n="$EPOCHREALTIME" 'BEGIN { d = t0 + o - n; printf "%.3f\n", (d > 0) ? d : 0 }')"
}

# ---------------------------------------------------------------- start
read -r IDLE_BUSY0 IDLE_BUSY1 < <(core_busy_1s)
declare -A PORT PID_OF VERSION LOGF
declare -a BPORT=(0)
for i in 1 2 3; do
    pick_port
    BPORT[i]=$PICKED
done
for p in "${PEER_LIST[@]}"; do
    pick_port
    PORT[$p]=$PICKED
done

log "work dir $WORK; backend ports ${BPORT[*]:1}; victim: backend $VICTIM"
for i in 1 2 3; do
    mkdir -p "$WORK/b$i"
    nginx_temp_paths "$WORK/b$i"
    render "$PEERS_DIR/backend-nginx.conf" "$WORK/b$i/nginx.conf" "${BPORT[i]}" "$WORK/b$i"
    start_backend "$i"
done
VLOG="$WORK/b$VICTIM/access.log"

for p in "${PEER_LIST[@]}"; do
    start_peer "$p" "$PINLB_TOML"
done

# ---------------------------------------------------------------- header
host_facts
ENV_LINE="ROUNDS=$ROUNDS DURATION=$DURATION KILL_AT=$KILL_AT RESTART_AT=$RESTART_AT VICTIM=$VICTIM CONNS=$CONNS WARMUP=$WARMUP PEERS=\"$PEERS\""
[[ " ${PEER_LIST[*]} " == *" pinlb "* ]] && ENV_LINE+=" PINLB=$PINLB PINLB_TOML=$PINLB_TOML"

echo "== pinlb failover benchmark =="
echo "command:   $ENV_LINE $CMDLINE"
echo "nproc:     $NCPU ($CPU_MODEL); before start: core0 ${IDLE_BUSY0}% busy, core1 ${IDLE_BUSY1}% busy"
echo "topology:  proxy under test -> core 0 (1 worker); 3 backend nginx (1 worker each) + wrk -t1 -c$CONNS -> core 1"
echo "           backends 127.0.0.1:${BPORT[1]},${BPORT[2]},${BPORT[3]} pids ${BPID[*]:1}; victim: backend $VICTIM, SIGKILL at ${KILL_AT}s, restart at ${RESTART_AT}s of each ${DUR_S}s run"
for p in "${PEER_LIST[@]}"; do
    echo "           $p ${VERSION[$p]} 127.0.0.1:${PORT[$p]} pid ${PID_OF[$p]}"
done
BUSY=0
if ((IDLE_BUSY0 > 10 || IDLE_BUSY1 > 10)); then
    BUSY=1
    log "WARNING: cores busy before start (core0 ${IDLE_BUSY0}%, core1 ${IDLE_BUSY1}%) - something else is running; numbers will be noisy"
fi

# ---------------------------------------------------------------- rounds
RAW="$WORK/raw.tsv" # round peer failed requests rps p99_us max_us readmitted sockerr non2xx t_kill t_restart t_ready
: >"$RAW"
for ((r = 1; r <= ROUNDS; r++)); do
    for p in "${PEER_LIST[@]}"; do
        pid=${PID_OF[$p]}
        kill -0 "$pid" 2>/dev/null || { cat "${LOGF[$p]}" >&2 || true; die "$p (pid $pid) died"; }
        readmitted "$p" || log "WARNING: $p sent no request to backend $VICTIM within 15 s before round $r"
        if [[ $WARMUP != 0 ]]; then
            start_wrk "${PORT[$p]}" "$WARMUP" "$WORK/warmup.txt"
            wait_wrk "$WORK/warmup.txt"
        fi

        out="$WORK/wrk-$r-$p.txt"
        start_wrk "${PORT[$p]}" "${DUR_S}s" "$out"
        t0=$EPOCHREALTIME
        sleep_until "$t0" "$KILL_AT"
        kill_backend "$VICTIM"
        t_kill=$(since "$t0")
        sleep_until "$t0" "$RESTART_AT"
        mv -f "$VLOG" "$WORK/b$VICTIM/access-before-restart-$r-$p.log" 2>/dev/null || true
        t_restart=$(since "$t0")
        start_backend "$VICTIM"
        t_ready=$(since "$t0")
        wait_wrk "$out"
        readm=$(served "$VLOG")
        kill -0 "$pid" 2>/dev/null || { cat "${LOGF[$p]}" >&2 || true; die "$p (pid $pid) died during round $r"; }

        rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
        reqs=$(awk '/ requests in / {print $1}' "$out")
        p99raw=$(awk '$1 == "99%" {print $2}' "$out")
        maxraw=$(awk '$1 == "Latency" && NF >= 4 {print $4; exit}' "$out")
        sockerr=$(awk '/Socket errors:/ { s = 0; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+,?$/) s += $i; print s }' "$out")
        non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$out")
        [[ -n $rps && -n $reqs && -n $p99raw && -n $maxraw ]] || { cat "$out" >&2; die "could not parse wrk output ($out)"; }
        p99=$(to_us "$p99raw")
        maxl=$(to_us "$maxraw")
        failed=$((${sockerr:-0} + ${non2xx:-0}))
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$p" "$failed" "$reqs" "$rps" "$p99" "$maxl" \
            "$readm" "${sockerr:-0}" "${non2xx:-0}" "$t_kill" "$t_restart" "$t_ready" >>"$RAW"
        printf 'round %d/%d  %-8s failed %6s (socket %s, non-2xx/3xx %s)  %8s requests  %8.0f req/s  p99 %8s us  max %8s us  readmitted %s  (kill %ss, restart %ss, ready %ss)\n' \
            "$r" "$ROUNDS" "$p" "$failed" "${sockerr:-0}" "${non2xx:-0}" "$reqs" "$rps" "$p99" "$maxl" "$readm" "$t_kill" "$t_restart" "$t_ready"
        if ((readm == 0)); then log "WARNING: $p sent no request to backend $VICTIM after its restart in round $r"; fi
    done
done

# ---------------------------------------------------------------- summary
median() { # PEER COLUMN
    awk -F'\t' -v p="$1" -v c="$2" '$2 == p {print $c}' "$RAW" | sort -g |
        awk '{ a[NR] = $1 } END { if (NR == 0) print "nan"; else print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

declare -A MED_FAIL MED_P99 MED_RPS MED_READM SUM_FAIL
for p in "${PEER_LIST[@]}"; do
    MED_FAIL[$p]=$(median "$p" 3)
    MED_RPS[$p]=$(median "$p" 5)
    MED_P99[$p]=$(median "$p" 6)
    MED_READM[$p]=$(median "$p" 8)
    SUM_FAIL[$p]=$(awk -F'\t' -v p="$p" '$2 == p {s += $3} END {print s + 0}' "$RAW")
done

MD="$WORK/report.md"
PEERS_CSV="${PEER_LIST[*]}"
PEERS_CSV=${PEERS_CSV// /, }
if [[ $WARMUP == 0 ]]; then WARMUP_TXT="no warm-up"; else WARMUP_TXT="a $WARMUP unrecorded warm-up"; fi
{
    echo "### Failover: pinlb vs nginx vs HAProxy ($(date -u +%Y-%m-%d), commit $COMMIT)"
    echo
    echo "- Command: \`$ENV_LINE $CMDLINE\`"
    echo "- Host: nproc=$NCPU, $CPU_MODEL, $(uname -sr); before start core0 ${IDLE_BUSY0}% / core1 ${IDLE_BUSY1}% busy"
    echo "- Topology: proxy under test pinned to core 0 with one worker, round robin over three backends (nginx, 1 worker each, \`return 200\`) that share core 1 with \`wrk -t1 -c$CONNS --latency\`. Configs: \`benches/peers/failover/\`."
    echo "- Each run: $WARMUP_TXT, then ${DUR_S}s recorded; backend $VICTIM gets SIGKILL (master + worker) at ${KILL_AT}s and is restarted on the same port at ${RESTART_AT}s. $ROUNDS interleaved rounds (${PEERS_CSV}, repeat). Medians over rounds. Failed = wrk socket errors (connect, read, write, timeout > 2 s) + non-2xx/3xx responses. Readmitted = wrk requests the restarted backend answered."
    echo
    echo "| proxy | version | failed requests (median) | failed (all rounds) | p99 µs (median) | req/s (median) | readmitted requests (median) |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    for p in "${PEER_LIST[@]}"; do
        printf '| %s | %s | %s | %s | %.0f | %.0f | %s |\n' "$p" "${VERSION[$p]}" \
            "${MED_FAIL[$p]}" "${SUM_FAIL[$p]}" "${MED_P99[$p]}" "${MED_RPS[$p]}" "${MED_READM[$p]}"
    done
    others=()
    for p in "${PEER_LIST[@]}"; do [[ $p == pinlb ]] || others+=("$p"); done
    if [[ " ${PEER_LIST[*]} " == *" pinlb "* ]]; then
        echo
        echo "Target: pinlb with zero failed requests, and a p99 during failover no worse than the best peer's."
        echo
        if ((SUM_FAIL[pinlb] == 0)); then
            echo "- failed requests: pinlb **0** in all rounds - **met**"
        else
            echo "- failed requests: pinlb **${SUM_FAIL[pinlb]}** over $ROUNDS round(s) - **not met**"
        fi
        if ((${#others[@]} > 0)); then
            best="" best_p=""
            for p in "${others[@]}"; do
                if [[ -z $best ]] || awk -v a="${MED_P99[$p]}" -v b="$best" 'BEGIN { exit !(a < b) }'; then
                    best=${MED_P99[$p]} best_p=$p
                fi
            done
            ratio=$(awk -v a="${MED_P99[pinlb]}" -v b="$best" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
            if awk -v a="${MED_P99[pinlb]}" -v b="$best" 'BEGIN { exit !(a <= b) }'; then verdict=met; else verdict="not met"; fi
            echo "- p99: pinlb ${MED_P99[pinlb]} µs ÷ $best_p ${best} µs = **$ratio** (≤ 1 meets the target) - **$verdict**"
        fi
    fi
    if ((BUSY)); then
        echo
        echo "**Warning:** the cores were busy before the start (core0 ${IDLE_BUSY0}%, core1 ${IDLE_BUSY1}%): another program was running; these numbers are noisy."
    fi
    echo
    echo "<details><summary>per-round results</summary>"
    echo
    echo "| round | proxy | failed | socket errors | non-2xx/3xx | requests | req/s | p99 µs | max µs | readmitted | kill at s | restart at s | backend ready at s |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %.0f | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $9, $10, $4, $5, $6, $7, $8, $11, $12, $13 }' "$RAW"
    echo
    echo "</details>"
} >"$MD"

publish_report "$MD"
