#!/usr/bin/env bash
# benches/compare.sh - compare pinlb with nginx and HAProxy as HTTP/1.1 reverse
# proxies, in one run, with interleaved rounds, using wrk.
#
# Topology (identical for every proxy; meant for a 2-core machine):
#   core 0: the proxy under test, ONE worker (`taskset -c 0`; nginx
#           worker_processes 1, haproxy nbthread 1, pinlb [runtime] cpus = [0]).
#   core 1: the shared backend (a separate nginx, worker_processes 1, answering
#           `200 "hello world\n"`, access_log off) AND the load generator
#           (`taskset -c 1 wrk -t1 -c$CONNS -d$DURATION --latency`).
#   Every proxy keeps up to 64 keep-alive connections to the backend, adds
#   X-Forwarded-For, and has logging and compression off. nginx's per-connection
#   request limits (keepalive_requests, default 1000) are raised on the backend
#   and on the nginx proxy so that no proxy is forced to reconnect mid-run.
#   Configs: benches/peers/*.{conf,cfg,toml}, rendered into a mktemp -d dir.
#
# Procedure: the backend and every proxy in $PEERS are started ONCE for the
# whole run, each on its own loopback port, and polled (curl, bounded loop)
# until they answer. Then, for each of $ROUNDS rounds, each proxy in $PEERS
# order gets an unrecorded warm-up wrk run ($WARMUP) followed by the recorded
# wrk run ($DURATION) - so rounds interleave: pinlb, nginx, haproxy, pinlb, ...
#
# Measured per round and proxy:
#   req/s        wrk "Requests/sec"
#   p99          wrk --latency 99% line, normalised to microseconds
#   errors       wrk socket errors (connect+read+write+timeout) + non-2xx/3xx
#   CPU us/req   (utime+stime) delta of ALL processes of the proxy (nginx:
#                master+worker; haproxy: its process(es); pinlb: its process,
#                all threads) from /proc/PID/stat fields 14+15 (clock ticks,
#                getconf CLK_TCK), divided by the requests wrk completed
#   user us/req  the user-space part of it (utime alone); the rest is the kernel's
#                (system calls, TCP, waking the other end of each socket)
#   with SYSCALLS=1, also: system calls per request made by the proxy's
#                processes (`perf stat -e raw_syscalls:sys_enter` attached for the
#                run), and TCP segments sent per request on the whole machine
#                (Tcp OutSegs from /proc/net/snmp: client, proxy and backend legs;
#                four is the least a proxied request can take)
#   core busy    % busy of core 0 and core 1 during the run (/proc/stat), and
#                core 0's busy % NOT spent in the proxy's processes - rounds
#                where that exceeds 10% (another program running) are flagged
#   sleeps/req   voluntary context switches of the proxy's threads per request:
#                how often it ran out of work and waited (parked in epoll_wait,
#                then woken); the kernel's cost of each is in its CPU per request
#   steal        % of core 0's and core 1's time the hypervisor gave to other
#                guests during the round (/proc/stat's steal; counted as busy,
#                so it is in "busy outside proxy" too): a shared host's noise
# Summary: per proxy the median over rounds of req/s, p99 and CPU us/req, plus
# min/max req/s; and pinlb's ratios against the best peer, over all rounds and,
# when some were flagged, over the quiet rounds alone. Printed as Markdown
# and written to $OUT_MD.
#
# Usage (from anywhere; root or not):
#   bash benches/compare.sh
#   PEERS="nginx haproxy" ROUNDS=2 DURATION=3s bash benches/compare.sh
# Environment:
#   ROUNDS=5            recorded rounds per proxy
#   DURATION=10s        wrk duration of each recorded run
#   CONNS=64            wrk connections (-c); wrk always uses one thread (-t1)
#   WARMUP=1s           unrecorded wrk run before each recorded run; 0 = none
#   PEERS="pinlb nginx haproxy"   proxies to run, in this order; also
#                       pinlb-metrics ([admin] on, so the request path counts
#                       metrics) and pinlb-log (access log to a file), which
#                       are reported against plain pinlb
#                       (benches/peers/pinlb-*.toml), and pinlb-base (plain pinlb's
#                       configuration on the binary PINLB_BASE: a change against
#                       the build before it, interleaved in the same run)
#   PINLB=target/release/pinlb    pinlb binary (relative to the repo root)
#   OUT_MD=/tmp/pinlb-compare.md  where the Markdown report is written
#   PORT_BASE=18080     ports: the first free loopback ports >= PORT_BASE
#                       (checked with `ss -ltn`), in order backend, then PEERS
#   KEEP_TMP=0          1 = keep the temp dir (configs, logs, wrk outputs)
#   SYSCALLS=0          1 = count system calls and TCP segments per request (see
#                       above). The syscall tracepoint costs each proxy a little per
#                       call, more for one that makes more calls, so don't read
#                       throughput from such a run; run it separately.
# Needs: nginx, haproxy, wrk (installed with apt-get if missing and root),
# curl, taskset, ss, awk, getconf.
#
# Don't run it while something else is busy on the machine (e.g. cargo build):
# both cores are part of the measurement. Both cores are sampled for 1 s
# before anything starts and a warning is printed if either is >10% busy.

set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_DIR="$ROOT/benches/peers"
CMDLINE="bash $0${*:+ $*}"

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
WARMUP=${WARMUP:-1s}
SYSCALLS=${SYSCALLS:-0}
PEERS=${PEERS:-pinlb nginx haproxy}
PINLB=${PINLB:-target/release/pinlb}
OUT_MD=${OUT_MD:-/tmp/pinlb-compare.md}
PORT_BASE=${PORT_BASE:-18080}
KEEP_TMP=${KEEP_TMP:-0}

case $PINLB in /*) ;; *) PINLB="$ROOT/$PINLB" ;; esac
PATH="$PATH:/usr/sbin:/sbin"

log() { printf '[compare] %s\n' "$*" >&2; }
die() { printf '[compare] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer (got '$ROUNDS')"
[[ $CONNS =~ ^[1-9][0-9]*$ ]] || die "CONNS must be a positive integer (got '$CONNS')"
[[ $PORT_BASE =~ ^[0-9]+$ ]] || die "PORT_BASE must be a number (got '$PORT_BASE')"
read -r -a PEER_LIST <<<"$PEERS"
((${#PEER_LIST[@]} > 0)) || die "PEERS is empty"
for p in "${PEER_LIST[@]}"; do
    case $p in pinlb | pinlb-metrics | pinlb-log | pinlb-base | nginx | haproxy) ;; *) die "unknown peer '$p' (known: pinlb pinlb-metrics pinlb-log pinlb-base nginx haproxy)" ;; esac
done

# ---------------------------------------------------------------- tools
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
install_missing "nginx-light haproxy wrk" nginx haproxy wrk
require nginx haproxy wrk curl taskset ss awk getconf sort
if ((SYSCALLS)); then
    install_missing linux-perf perf
    require perf
fi
if [[ " ${PEER_LIST[*]} " == *" pinlb"* ]]; then
    [[ -x $PINLB ]] || die "pinlb binary not found at $PINLB (build it: cargo build --release, or set PINLB=..., or PEERS=\"nginx haproxy\")"
    "$PINLB" --version >/dev/null 2>&1 || die "'$PINLB --version' failed"
fi

NCPU=$(nproc)
CLK_TCK=$(getconf CLK_TCK)
((NCPU >= 2)) || die "need at least 2 cores (0 and 1); nproc=$NCPU"

# ---------------------------------------------------------------- cleanup
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pinlb-compare.XXXXXX")
chmod 755 "$WORK" # nginx workers may run as an unprivileged user when root
PIDS=()           # every process we started (long-lived ones)
WRK_PID=""

PERF_PID=""
running_pids() { echo "$WRK_PID" "$PERF_PID" "${PIDS[@]}"; }

# Tcp OutSegs so far, machine-wide (/proc/net/snmp: a header line, then the values).
tcp_out_segs() {
    awk '$1 == "Tcp:" { if (!n) { for (i = 2; i <= NF; i++) if ($i == "OutSegs") c = i; n = 1 } else print $c }' /proc/net/snmp
}

# ---------------------------------------------------------------- helpers
install_cleanup

# render TEMPLATE DEST PORT DIR
render() {
    sed -e "s|@DIR@|$4|g" -e "s|@PORT@|$3|g" -e "s|@BACKEND_PORT@|$BACKEND_PORT|g" "$1" >"$2"
}

# ---------------------------------------------------------------- start
# Is the machine quiet? Sample both cores for 1 s before starting anything.
read -r IDLE_BUSY0 IDLE_BUSY1 < <(core_busy_1s)

declare -A PORT PID_OF VERSION LOGF
pick_port
BACKEND_PORT=$PICKED
for p in "${PEER_LIST[@]}"; do
    pick_port
    PORT[$p]=$PICKED
done

log "work dir $WORK; backend port $BACKEND_PORT"
mkdir -p "$WORK/backend"
nginx_temp_paths "$WORK/backend"
render "$PEERS_DIR/backend-nginx.conf" "$WORK/backend/nginx.conf" "" "$WORK/backend"
taskset -c 1 nginx -p "$WORK/backend" -c "$WORK/backend/nginx.conf" -e "$WORK/backend/error.log" \
    >"$WORK/backend/stdout.log" 2>&1 &
BACKEND_PID=$!
PIDS+=("$BACKEND_PID")
wait_ready backend "$BACKEND_PORT" "$BACKEND_PID" "$WORK/backend/error.log"

for p in "${PEER_LIST[@]}"; do
    start_peer "$p" "$PEERS_DIR/$p.toml"
done

# ---------------------------------------------------------------- header
host_facts
ENV_LINE="ROUNDS=$ROUNDS DURATION=$DURATION CONNS=$CONNS WARMUP=$WARMUP PEERS=\"$PEERS\""
if ((SYSCALLS)); then ENV_LINE+=" SYSCALLS=1"; fi
[[ " ${PEER_LIST[*]} " == *" pinlb "* ]] && ENV_LINE+=" PINLB=$PINLB"
[[ " ${PEER_LIST[*]} " == *" pinlb-base "* ]] && ENV_LINE+=" PINLB_BASE=$PINLB_BASE"

echo "== pinlb comparison benchmark =="
echo "command:   $ENV_LINE $CMDLINE"
echo "nproc:     $NCPU ($CPU_MODEL), CLK_TCK=$CLK_TCK; before start: core0 ${IDLE_BUSY0}% busy, core1 ${IDLE_BUSY1}% busy"
echo "topology:  proxy under test -> core 0 (1 worker); backend nginx (1 worker) + wrk -t1 -c$CONNS -> core 1"
echo "           backend 127.0.0.1:$BACKEND_PORT pid $BACKEND_PID (+$(children "$BACKEND_PID" | wc -l) worker) affinity $(affinity "$BACKEND_PID")"
describe_procs "${PEER_LIST[@]}"

# ---------------------------------------------------------------- rounds
RAW="$WORK/raw.tsv" # round peer rps p99_us errors cpu_us_per_req requests core0% core1% other0% syscalls segs user_us_per_req steal0% steal1% sleeps_per_req
: >"$RAW"
for ((r = 1; r <= ROUNDS; r++)); do
    for p in "${PEER_LIST[@]}"; do
        pid=${PID_OF[$p]}
        kill -0 "$pid" 2>/dev/null || { cat "${LOGF[$p]}" >&2 || true; die "$p (pid $pid) died"; }
        if [[ $WARMUP != 0 ]]; then run_wrk "${PORT[$p]}" "$WARMUP" "$WORK/warmup.txt"; fi
        mapfile -t tree < <(proc_tree "$pid")
        c0=$(cpu_ticks "${tree[@]}")
        u0=$(user_ticks "${tree[@]}")
        z0=$(sleeps "${tree[@]}")
        j0=$(core_jiffies)
        st0=$(core_steal_jiffies)
        out="$WORK/wrk-$r-$p.txt"
        if ((SYSCALLS)); then
            segs0=$(tcp_out_segs)
            perf stat -x, -e raw_syscalls:sys_enter -p "$(IFS=,; echo "${tree[*]}")" \
                -o "$WORK/perf-$r-$p.txt" -- sleep "$DURATION" 2>/dev/null &
            PERF_PID=$!
        fi
        run_wrk "${PORT[$p]}" "$DURATION" "$out"
        sys_req="-" segs_req="-"
        if ((SYSCALLS)); then
            wait "$PERF_PID" || true
            PERF_PID=""
            segs1=$(tcp_out_segs)
        fi
        c1=$(cpu_ticks "${tree[@]}")
        u1=$(user_ticks "${tree[@]}")
        z1=$(sleeps "${tree[@]}")
        read -r busy0 busy1 < <(core_busy "$j0" "$(core_jiffies)")
        read -r steal0 steal1 < <(core_busy "$st0" "$(core_steal_jiffies)")
        kill -0 "$pid" 2>/dev/null || { cat "${LOGF[$p]}" >&2 || true; die "$p (pid $pid) died during round $r"; }

        rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
        reqs=$(awk '/ requests in / {print $1}' "$out")
        p99raw=$(awk '$1 == "99%" {print $2}' "$out")
        sockerr=$(awk '/Socket errors:/ { s = 0; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+,?$/) s += $i; print s }' "$out")
        non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$out")
        [[ -n $rps && -n $reqs && -n $p99raw ]] || { cat "$out" >&2; die "could not parse wrk output ($out)"; }
        p99=$(to_us "$p99raw")
        dur_us=$(to_us "$(awk '/ requests in / { sub(/,$/, "", $4); print $4 }' "$out")")
        # core 0 busy time not spent in the proxy's processes (other programs,
        # or softirq work not charged to the proxy): should be small.
        other0=$(awk -v d=$((c1 - c0)) -v hz="$CLK_TCK" -v t="$dur_us" -v b="$busy0" \
            'BEGIN { o = (t > 0) ? b - 100 * d * 1e6 / hz / t : 0; printf "%.0f\n", (o < 0) ? 0 : o }')
        errors=$((${sockerr:-0} + ${non2xx:-0}))
        cpu=$(awk -v d=$((c1 - c0)) -v hz="$CLK_TCK" -v n="$reqs" 'BEGIN { printf "%.2f\n", (n > 0) ? d * 1e6 / hz / n : 0 }')
        user=$(awk -v d=$((u1 - u0)) -v hz="$CLK_TCK" -v n="$reqs" 'BEGIN { printf "%.2f\n", (n > 0) ? d * 1e6 / hz / n : 0 }')
        slept=$(awk -v d=$((z1 - z0)) -v n="$reqs" 'BEGIN { printf "%.4f\n", (n > 0) ? d / n : 0 }')
        if ((SYSCALLS)); then
            calls=$(awk -F, '$3 == "raw_syscalls:sys_enter" { print $1 }' "$WORK/perf-$r-$p.txt")
            read -r sys_req segs_req < <(awk -v c="${calls:-0}" -v s=$((segs1 - segs0)) -v n="$reqs" \
                'BEGIN { printf "%.2f %.2f\n", (n > 0) ? c / n : 0, (n > 0) ? s / n : 0 }')
        fi
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$p" "$rps" "$p99" "$errors" "$cpu" "$reqs" "$busy0" "$busy1" "$other0" "$sys_req" "$segs_req" "$user" "$steal0" "$steal1" "$slept" >>"$RAW"
        printf 'round %d/%d  %-8s %8.0f req/s  p99 %6s us  cpu %6s us/req  core0 %3s%% (other %2s%%, stolen %2s%%)  core1 %3s%% (stolen %2s%%)  errors %s%s\n' \
            "$r" "$ROUNDS" "$p" "$rps" "$p99" "$cpu" "$busy0" "$other0" "$steal0" "$busy1" "$steal1" "$errors" \
            "$( ((errors > 0)) && echo "  (socket: ${sockerr:-0}, non-2xx/3xx: ${non2xx:-0})")"
        if ((SYSCALLS)); then printf '              %s system calls and %s TCP segments per request\n' "$sys_req" "$segs_req"; fi
        if ((errors > 0)); then log "WARNING: $p had errors in round $r"; fi
        if ((other0 > 10)); then
            log "WARNING: core 0 was ${other0}% busy outside $p in round $r - something else is running?"
        fi
    done
done

# ---------------------------------------------------------------- summary

declare -A MED_RPS MIN_RPS MAX_RPS MED_P99 MED_CPU MED_USER ERRS
for p in "${PEER_LIST[@]}"; do
    read -r "MED_RPS[$p]" "MIN_RPS[$p]" "MAX_RPS[$p]" < <(stats "$p" 3)
    read -r "MED_P99[$p]" _ _ < <(stats "$p" 4)
    read -r "MED_CPU[$p]" _ _ < <(stats "$p" 6)
    read -r "MED_USER[$p]" _ _ < <(stats "$p" 13)
    ERRS[$p]=$(awk -F'\t' -v p="$p" '$2 == p {s += $5} END {print s + 0}' "$RAW")
done

MD="$WORK/report.md"
PEERS_CSV="${PEER_LIST[*]}"
PEERS_CSV=${PEERS_CSV// /, }
if [[ $WARMUP == 0 ]]; then WARMUP_TXT="no warm-up"; else WARMUP_TXT="a $WARMUP unrecorded warm-up"; fi
{
    title="pinlb vs nginx vs HAProxy"
    [[ " ${PEER_LIST[*]} " == *" nginx "* || " ${PEER_LIST[*]} " == *" haproxy "* ]] ||
        title="pinlb with and without its optional features"
    echo "### $title ($(date -u +%Y-%m-%d), commit $COMMIT)"
    echo
    echo "- Command: \`$ENV_LINE $CMDLINE\`"
    echo "- Host: nproc=$NCPU, $CPU_MODEL, $(uname -sr); before start core0 ${IDLE_BUSY0}% / core1 ${IDLE_BUSY1}% busy"
    echo "- Topology: proxy under test pinned to core 0 with one worker (nginx \`worker_processes 1\`, HAProxy \`nbthread 1\`, pinlb \`cpus = [0]\`); backend nginx (1 worker, \`return 200 \"hello world\\n\"\`) and \`wrk -t1 -c$CONNS --latency\` share core 1. Keep-alive on both sides (64 pooled upstream connections), X-Forwarded-For added, no logs, no gzip."
    echo "- $ROUNDS interleaved rounds (${PEERS_CSV}, repeat), each $WARMUP_TXT then $DURATION recorded; proxies started once for the whole run. Medians over rounds; CPU = utime+stime of all the proxy's processes per completed request, user = utime alone (the rest is the kernel's)."
    echo
    echo "| proxy | version | req/s (median) | req/s min | req/s max | p99 µs (median) | CPU µs/req (median) | of it user µs/req (median) | errors (all rounds) |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
    for p in "${PEER_LIST[@]}"; do
        printf '| %s | %s | %.0f | %.0f | %.0f | %.0f | %.2f | %.2f | %s |\n' "$p" "${VERSION[$p]}" \
            "${MED_RPS[$p]}" "${MIN_RPS[$p]}" "${MAX_RPS[$p]}" "${MED_P99[$p]}" "${MED_CPU[$p]}" "${MED_USER[$p]}" "${ERRS[$p]}"
    done
    others=()
    for p in "${PEER_LIST[@]}"; do [[ $p == pinlb* ]] || others+=("$p"); done
    if [[ " ${PEER_LIST[*]} " == *" pinlb "* ]] && ((${#others[@]} > 0)); then
        best_rps="" best_rps_p="" best_p99="" best_p99_p="" best_cpu="" best_cpu_p=""
        for p in "${others[@]}"; do
            if [[ -z $best_rps ]] || awk -v a="${MED_RPS[$p]}" -v b="$best_rps" 'BEGIN { exit !(a > b) }'; then
                best_rps=${MED_RPS[$p]} best_rps_p=$p
            fi
            if [[ -z $best_p99 ]] || awk -v a="${MED_P99[$p]}" -v b="$best_p99" 'BEGIN { exit !(a < b) }'; then
                best_p99=${MED_P99[$p]} best_p99_p=$p
            fi
            if [[ -z $best_cpu ]] || awk -v a="${MED_CPU[$p]}" -v b="$best_cpu" 'BEGIN { exit !(a < b) }'; then
                best_cpu=${MED_CPU[$p]} best_cpu_p=$p
            fi
        done
        ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
        echo
        echo "pinlb relative to the best peer (medians):"
        echo
        echo "- throughput: pinlb req/s ÷ $best_rps_p req/s = **$(ratio "${MED_RPS[pinlb]}" "$best_rps")** (> 1 is better)"
        echo "- p99 latency: pinlb p99 ÷ $best_p99_p p99 = **$(ratio "${MED_P99[pinlb]}" "$best_p99")** (< 1 is better)"
        echo "- CPU per request: pinlb ÷ $best_cpu_p = **$(ratio "${MED_CPU[pinlb]}" "$best_cpu")** (< 1 is leaner)"
        # Paired within each round (pinlb against the best peer of that same round), then the
        # median over rounds: drift between rounds cancels out better than in a ratio of medians.
        # paired FILE: "req/s ratio, CPU ratio, rounds" over the rounds in FILE.
        paired() {
            local per_round
            per_round=$(awk -F'\t' '
                $2 == "pinlb" { rps[$1] = $3; cpu[$1] = $6; next }
                $2 ~ /^pinlb-/ { next }
                { if ($3 > best[$1]) best[$1] = $3; if (!($1 in lean) || $6 < lean[$1]) lean[$1] = $6 }
                END { for (r in rps) if (best[r] > 0 && lean[r] > 0) printf "%f %f\n", rps[r] / best[r], cpu[r] / lean[r] }' "$1")
            echo "$(awk '{ print $1 }' <<<"$per_round" | median) $(awk '{ print $2 }' <<<"$per_round" | median) $(grep -c . <<<"$per_round")"
        }
        median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.2f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
        read -r paired_rps paired_cpu paired_n < <(paired "$RAW")
        echo
        echo "Paired per round, median of $paired_n rounds: throughput pinlb ÷ best peer = **$paired_rps**, CPU per request pinlb ÷ leaner peer = **$paired_cpu**."
        # The quiet rounds alone: those in which no proxy's core 0 was more than 10% busy
        # outside it. On a shared host (a VM whose neighbours take its time) some rounds are
        # not quiet, and they move every figure; a bar asked "on a quiet machine" is read here.
        QUIET="$WORK/quiet.tsv"
        awk -F'\t' 'NR == FNR { if ($10 > 10) noisy[$1] = 1; next } !($1 in noisy)' "$RAW" "$RAW" >"$QUIET"
        quiet_n=$(awk -F'\t' '{ r[$1] = 1 } END { print length(r) }' "$QUIET")
        if ((quiet_n > 0 && quiet_n < ROUNDS)); then
            read -r q_rps q_cpu _ < <(paired "$QUIET")
            echo
            echo "Quiet rounds only ($quiet_n of $ROUNDS: no proxy's core 0 more than 10% busy outside it), medians:"
            echo
            echo "| proxy | req/s | CPU µs/req | of it user µs/req |"
            echo "|---|---:|---:|---:|"
            for p in "${PEER_LIST[@]}"; do
                read -r q_r _ _ < <(RAW="$QUIET" stats "$p" 3)
                read -r q_c _ _ < <(RAW="$QUIET" stats "$p" 6)
                read -r q_u _ _ < <(RAW="$QUIET" stats "$p" 13)
                printf '| %s | %.0f | %.2f | %.2f |\n' "$p" "$q_r" "$q_c" "$q_u"
            done
            echo
            echo "Paired per quiet round, median of $quiet_n: throughput pinlb ÷ best peer = **$q_rps**, CPU per request pinlb ÷ leaner peer = **$q_cpu**."
        fi
    fi
    # pinlb with a feature on against plain pinlb (issue 6: metrics within 3%, access log
    # within 10% of throughput).
    for v in "${PEER_LIST[@]}"; do
        [[ $v == pinlb-* && " ${PEER_LIST[*]} " == *" pinlb "* ]] || continue
        vs=$(awk -F'\t' -v v="$v" '
            $2 == "pinlb" { base[$1] = $3 } $2 == v { var[$1] = $3 }
            END { for (r in var) if (base[r] > 0) printf "%f\n", var[r] / base[r] }' "$RAW" |
            sort -g | awk '{ a[NR] = $1 } END { if (NR) printf "%.3f", (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
        echo
        echo "- $v ÷ pinlb throughput: **$(awk -v a="${MED_RPS[$v]}" -v b="${MED_RPS[pinlb]}" 'BEGIN { printf "%.3f", a / b }')** (ratio of medians), **$vs** (paired per round, median); CPU per request $(awk -v a="${MED_CPU[$v]}" -v b="${MED_CPU[pinlb]}" 'BEGIN { printf "%.3f", a / b }')×"
    done
    noisy=$(awk -F'\t' '$10 > 10 { n++ } END { print n + 0 }' "$RAW")
    if ((noisy > 0)); then
        echo
        stolen=$(awk -F'\t' '$10 > 10 && $14 + 0 >= $10 / 2 { n++ } END { print n + 0 }' "$RAW")
        echo "**Warning:** in $noisy round(s) core 0 was more than 10% busy outside the proxy under test (another program was running, or the host took the time: in $stolen of them at least half of it was steal); those numbers are noisy."
    fi
    echo
    echo "<details><summary>per-round results</summary>"
    echo
    echo "| round | proxy | req/s | p99 µs | CPU µs/req | user µs/req | system calls/req | TCP segments/req | errors | requests | core0 busy | core0 busy outside proxy | core1 busy | core0 / core1 stolen by the host | sleeps/req |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    awk -F'\t' '{ printf "| %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s%% | %s%% | %s%% | %s%% / %s%% | %s |\n", $1, $2, $3, $4, $6, $13, $11, $12, $5, $7, $8, $10, $9, $14, $15, $16 }' "$RAW"
    echo
    echo "</details>"
} >"$MD"

publish_report "$MD"
