#!/usr/bin/env bash
# benches/spawn.sh - a rolling restart of spawned backends under load: pinlb runs
# 4 `pinlb backend` processes itself ([upstream.app.spawn]); `pinlb bench` loads
# it; mid-run a reload changes the spawn table (an env var), so pinlb restarts
# the 4 processes one at a time (start the new one on the other port range,
# wait until it answers, swap it into the pool, drain the old one, SIGTERM it).
# Count the requests that failed, and how long the rolling restart took.
#
# Topology (meant for a 2-core machine):
#   core 0: pinlb, ONE worker ([runtime] cpus = [0]: workers and control thread).
#   core 1: the 4 spawned backends (spawn.cpus = [1]) AND the load generator
#           (`pinlb bench -t1 --cpus 1 -c$CONNS`, closed loop, keep-alive).
#
# Procedure: pinlb is started once and polled (curl /status, bounded) until
# its 4 processes are ready. For each of $ROUNDS rounds, two recorded runs of
# $DURATION each, in this order:
#   steady  no reload: the control, the same load on the same processes;
#   roll    at $RELOAD_AT s the config is rewritten with spawn.env.ROUND set
#           to a new value and pinlb gets SIGHUP; pinlb logs "rolling
#           restart done in X", which gives the roll's duration.
# Each run: `pinlb bench --warmup $WARMUP --rounds 1 -d $DURATION --json`.
#
# Measured per run: failed = the bench's errors (connect + timeout + read +
# non-2xx); requests = 2xx responses; req/s; p99; pinlb's CPU time per
# request (utime+stime of the pinlb process over the run, from /proc, divided
# by the responses); for roll runs the rolling restart's duration and whether
# every process got a new pid. Summary: totals of failed requests and medians
# of the rest over rounds, against the target: 0 failed requests in every roll
# run. There is no peer: nginx and HAProxy don't start their backends; the
# steady run is the comparison (what the roll costs in req/s and latency).
#
# Usage (from anywhere):
#   bash benches/spawn.sh
#   ROUNDS=1 DURATION=6s bash benches/spawn.sh
# Environment:
#   ROUNDS=3            rounds (each: one steady and one roll run)
#   DURATION=10s        recorded duration of each run (whole seconds)
#   RELOAD_AT=4         seconds into a roll run when the reload is sent
#   CONNS=64            bench connections (-c)
#   WARMUP=1s           unrecorded load before each run
#   COUNT=4             spawned processes
#   PINLB=target/release/pinlb    pinlb binary (relative to the repo root)
#   OUT_MD=/tmp/pinlb-spawn.md    where the Markdown report is written
#   PORT_BASE=18380     first port tried; the listener, the admin listener and
#                       2 x COUNT ports for the processes follow
#   KEEP_TMP=0          1 = keep the temp dir (config, log, JSON reports)
# Needs: curl, taskset, ss, awk, python3 (reads the bench's JSON).

set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
CMDLINE="bash $0${*:+ $*}"

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
RELOAD_AT=${RELOAD_AT:-4}
CONNS=${CONNS:-64}
WARMUP=${WARMUP:-1s}
COUNT=${COUNT:-4}
PINLB=${PINLB:-target/release/pinlb}
OUT_MD=${OUT_MD:-/tmp/pinlb-spawn.md}
PORT_BASE=${PORT_BASE:-18380}
KEEP_TMP=${KEEP_TMP:-0}

case $PINLB in /*) ;; *) PINLB="$ROOT/$PINLB" ;; esac

log() { printf '[spawn] %s\n' "$*" >&2; }
die() { printf '[spawn] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer (got '$ROUNDS')"
[[ $CONNS =~ ^[1-9][0-9]*$ ]] || die "CONNS must be a positive integer (got '$CONNS')"
[[ $COUNT =~ ^[1-9][0-9]*$ ]] || die "COUNT must be a positive integer (got '$COUNT')"
[[ $DURATION =~ ^([1-9][0-9]*)s?$ ]] || die "DURATION must be whole seconds, e.g. 10s (got '$DURATION')"
DUR_S=${BASH_REMATCH[1]}
awk -v r="$RELOAD_AT" -v d="$DUR_S" 'BEGIN { exit !(0 < r && r < d) }' ||
    die "need 0 < RELOAD_AT ($RELOAD_AT) < DURATION ($DUR_S)"

# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
require curl taskset ss awk python3
[[ -x $PINLB ]] || die "pinlb binary not found at $PINLB (build it: cargo build --release, or set PINLB=...)"
NCPU=$(nproc)
((NCPU >= 2)) || die "need at least 2 cores (0 and 1); nproc=$NCPU"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/pinlb-spawn.XXXXXX")
PINLB_PID=""
BENCH_PID=""
running_pids() { echo "$BENCH_PID" "$PINLB_PID"; }
install_cleanup

# Ports: the listener, the admin listener, then 2 x COUNT consecutive free ones.
pick_port
PORT=$PICKED
pick_port
ADMIN=$PICKED
for ((try = 0; try < 50; try++)); do
    pick_port
    SPAWN_BASE=$PICKED
    ok=1
    for ((i = 1; i < 2 * COUNT; i++)); do
        port_in_use $((SPAWN_BASE + i)) && { ok=0; break; }
    done
    ((ok)) && break
    NEXT_PORT=$((SPAWN_BASE + 2 * COUNT))
done
((ok)) || die "no $((2 * COUNT)) consecutive free ports from $PORT_BASE"

# write_config GENERATION: the config, its spawn.env.ROUND set to GENERATION.
write_config() {
    cat >"$WORK/pinlb.toml" <<EOF
[runtime]
cpus = [0]
[admin]
address = "127.0.0.1:$ADMIN"
[[listener]]
address = "127.0.0.1:$PORT"
upstream = "app"
[upstream.app.spawn]
command = ["$PINLB", "backend", "--listen", "127.0.0.1:{port}"]
count = $COUNT
cpus = [1]
port_base = $SPAWN_BASE
env = { ROUND = "$1" }
EOF
}

# Polls /status until COUNT processes are ready; bounded, 20 s.
wait_spawned() {
    local i n
    for ((i = 0; i < 200; i++)); do
        kill -0 "$PINLB_PID" 2>/dev/null || { cat "$WORK/pinlb.log" >&2; die "pinlb exited"; }
        n=$(curl -s --max-time 1 "http://127.0.0.1:$ADMIN/status" | grep -o '"state":"ready"' | wc -l) || n=0
        ((n == COUNT)) && return 0
        sleep 0.1
    done
    die "the spawned processes were not all ready within 20 s"
}

spawned_pids() {
    curl -s --max-time 1 "http://127.0.0.1:$ADMIN/status" |
        python3 -c 'import json,sys; print(" ".join(str(p["pid"]) for p in json.load(sys.stdin)["spawned"]))'
}

GEN=1
write_config "$GEN"
"$PINLB" check -c "$WORK/pinlb.toml" >"$WORK/check.log" 2>&1 || { cat "$WORK/check.log" >&2; die "pinlb check failed"; }
RUST_LOG=info "$PINLB" serve -c "$WORK/pinlb.toml" >"$WORK/pinlb.log" 2>&1 &
PINLB_PID=$!
wait_spawned
host_facts
read -r IDLE_BUSY0 IDLE_BUSY1 < <(core_busy_1s)

ENV_LINE="ROUNDS=$ROUNDS DURATION=$DURATION RELOAD_AT=$RELOAD_AT CONNS=$CONNS WARMUP=$WARMUP COUNT=$COUNT PINLB=$PINLB"
BENCH_CMD=("$PINLB" bench -t 1 --cpus 1 -c "$CONNS" -d "${DUR_S}s" --warmup "$WARMUP" --rounds 1)
echo "== pinlb spawned backends: rolling restart under load =="
echo "command:   $ENV_LINE $CMDLINE"
echo "nproc:     $NCPU ($CPU_MODEL); with pinlb idle: core0 ${IDLE_BUSY0}% busy, core1 ${IDLE_BUSY1}% busy"
echo "topology:  pinlb (1 worker) -> core 0; $COUNT spawned pinlb backend + ${BENCH_CMD[*]} -> core 1"
echo "           listener 127.0.0.1:$PORT, processes on ports $SPAWN_BASE-$((SPAWN_BASE + 2 * COUNT - 1))"

# figures JSON: "failed ok served rps p99_us" of the bench's first target; served counts the
# warm-up's responses too, which pinlb's CPU time over the run includes.
figures() {
    python3 - "$1" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))["targets"][0]
e = t["requests"]["errors"]
failed = sum(e[k] for k in ("connect", "handshake", "timeout", "read", "non_2xx"))
print(failed, t["requests"]["ok"], t["requests"]["ok"] + t["warmup"]["responses"],
      t["requests_per_sec"]["median"], round(t["latency"]["p99_us"]))
EOF
}

RAW="$WORK/raw.tsv" # round kind failed ok rps p99_us cpu_us_per_req roll_s new_pids
: >"$RAW"
for ((r = 1; r <= ROUNDS; r++)); do
    for kind in steady roll; do
        wait_spawned
        before_pids=$(spawned_pids)
        out="$WORK/bench-$r-$kind.json"
        t_cpu0=$(cpu_ticks "$PINLB_PID")
        rolls_before=$(grep -c "rolling restart done in" "$WORK/pinlb.log" || true)
        "${BENCH_CMD[@]}" --json "$out" "http://127.0.0.1:$PORT/" >"$WORK/bench-$r-$kind.txt" 2>&1 &
        BENCH_PID=$!
        roll_s="-"
        new="-"
        if [[ $kind == roll ]]; then
            w=${WARMUP%s}
            sleep "$(awk -v a="$w" -v b="$RELOAD_AT" 'BEGIN { print a + b }')"
            GEN=$((GEN + 1))
            write_config "$GEN"
            kill -HUP "$PINLB_PID"
        fi
        wait "$BENCH_PID" || { cat "$WORK/bench-$r-$kind.txt" >&2; die "pinlb bench failed"; }
        BENCH_PID=""
        t_cpu1=$(cpu_ticks "$PINLB_PID")
        if [[ $kind == roll ]]; then
            for ((i = 0; i < 100; i++)); do
                (($(grep -c "rolling restart done in" "$WORK/pinlb.log" || true) > rolls_before)) && break
                sleep 0.1
            done
            line=$(grep "rolling restart done in" "$WORK/pinlb.log" | tail -n 1)
            roll_s=$(awk '{ v = $NF; if (v ~ /ms$/) { sub(/ms$/, "", v); v /= 1000 } else sub(/s$/, "", v); printf "%.2f", v }' <<<"$line")
            wait_spawned
            after_pids=$(spawned_pids)
            new=yes
            for p in $before_pids; do [[ " $after_pids " == *" $p "* ]] && new=no; done
        fi
        read -r failed ok served rps p99 < <(figures "$out")
        tick_us=$(awk -v h="$(getconf CLK_TCK)" 'BEGIN { print 1e6 / h }')
        cpu_req=$(awk -v a="$t_cpu0" -v b="$t_cpu1" -v t="$tick_us" -v n="$served" \
            'BEGIN { if (n > 0) printf "%.2f", (b - a) * t / n; else print "nan" }')
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$kind" "$failed" "$ok" "$rps" "$p99" "$cpu_req" "$roll_s" "$new" >>"$RAW"
        printf 'round %d/%d  %-6s failed %4s  ok %8s  %8.0f req/s  p99 %6s us  pinlb %s us CPU/request  roll %s s  new pids %s\n' \
            "$r" "$ROUNDS" "$kind" "$failed" "$ok" "$rps" "$p99" "$cpu_req" "$roll_s" "$new"
    done
done

median() { # KIND COLUMN
    awk -F'\t' -v k="$1" -v c="$2" '$2 == k && $c != "-" {print $c}' "$RAW" | sort -g |
        awk '{ a[NR] = $1 } END { if (NR == 0) print "-"; else print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
sum_failed() { awk -F'\t' -v k="$1" '$2 == k {s += $3} END {print s + 0}' "$RAW"; }

MD="$WORK/report.md"
ROLL_FAILED=$(sum_failed roll)
ALL_NEW=$(awk -F'\t' '$2 == "roll" && $9 != "yes" {n++} END {print n + 0}' "$RAW")
{
    echo "### Spawned backends: rolling restart under load ($(date -u +%Y-%m-%d), commit $COMMIT)"
    echo
    echo "- Command: \`$ENV_LINE $CMDLINE\`"
    echo "- Host: nproc=$NCPU, $CPU_MODEL, $(uname -sr); with pinlb idle core0 ${IDLE_BUSY0}% / core1 ${IDLE_BUSY1}% busy"
    echo "- Topology: pinlb with one worker on core 0 spawns $COUNT \`pinlb backend\` processes pinned to core 1 (\`[upstream.app.spawn]\`), which they share with \`pinlb bench -t1 --cpus 1 -c$CONNS\` (keep-alive, closed loop)."
    echo "- Each round: a steady run (no reload) and a roll run (at ${RELOAD_AT}s a reload changes \`spawn.env\`, so all $COUNT processes are restarted one at a time), ${DUR_S}s each after a $WARMUP warm-up. Failed = the bench's connect + timeout + read errors + non-2xx. CPU/request = pinlb's own utime+stime over the run (warm-up included) ÷ its responses (warm-up included)."
    echo
    echo "| run | failed requests (all rounds) | 2xx (median) | req/s (median) | p99 µs (median) | pinlb µs CPU/request (median) | rolling restart s (median) |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    for kind in steady roll; do
        printf '| %s | %s | %s | %.0f | %s | %s | %s |\n' "$kind" "$(sum_failed $kind)" "$(median $kind 4)" \
            "$(median $kind 5)" "$(median $kind 6)" "$(median $kind 7)" "$(median $kind 8)"
    done
    echo
    if ((ROLL_FAILED == 0 && ALL_NEW == 0)); then
        echo "Target: 0 failed requests across a rolling restart of $COUNT spawned backends - **met** ($ROUNDS roll(s), every process replaced each time)."
    else
        echo "Target: 0 failed requests across a rolling restart of $COUNT spawned backends - **not met**: $ROLL_FAILED failed; $ALL_NEW roll(s) left an old process."
    fi
    echo
    echo "<details><summary>per-run results</summary>"
    echo
    echo "| round | run | failed | 2xx | req/s | p99 µs | pinlb µs CPU/request | roll s | all new pids |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---|"
    awk -F'\t' '{ printf "| %s | %s | %s | %s | %.0f | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }' "$RAW"
    echo
    echo "</details>"
} >"$MD"
publish_report "$MD"
