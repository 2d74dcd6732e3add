#!/usr/bin/env bash
# benches/lib.sh - helpers shared by the benchmark scripts (compare.sh, failover.sh,
# backend.sh, loadgen.sh). Sourced, not run. The caller defines log() and die(), and sets
# PORT_BASE before sourcing (pick_port starts there).
# shellcheck shell=bash

# Direct children of a pid (e.g. the nginx worker of a master).
children() {
    ps -o pid= --ppid "$1" 2>/dev/null | awk '{print $1}' || true
}

# The pid plus its children.
proc_tree() {
    echo "$1"
    children "$1"
}

# Sum of utime+stime (clock ticks) over the given pids.
cpu_ticks() { stat_ticks '$12 + $13' "$@"; }

# user_ticks PID...: the user-space part of cpu_ticks (utime, field 14).
user_ticks() { stat_ticks '$12' "$@"; }

# stat_ticks FIELDS PID...: FIELDS (an awk sum of /proc/PID/stat fields) summed over the PIDs.
stat_ticks() {
    local fields=$1 pid total=0 t
    shift
    for pid in "$@"; do
        # Field 2 (comm) may contain spaces: drop everything up to ") ", after
        # which field 3 (state) is $1, so fields 14/15 are $12/$13.
        t=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | awk "{print $fields}") || t=0
        total=$((total + ${t:-0}))
    done
    echo "$total"
}

# sleeps PID...: voluntary context switches of every thread of the given pids, summed: how
# many times they waited for work (for a proxy: parked in epoll_wait, then woken).
sleeps() {
    local pid total=0 t
    for pid in "$@"; do
        t=$(awk '/^voluntary_ctxt_switches/ { n += $2 } END { print n + 0 }' /proc/"$pid"/task/*/status 2>/dev/null) || t=0
        total=$((total + ${t:-0}))
    done
    echo "$total"
}

port_in_use() {
    ss -ltnH "sport = :$1" 2>/dev/null | grep -q . && return 0
    return 1
}

# pick_port: sets PICKED to the next free port >= NEXT_PORT (not in a
# subshell, so that NEXT_PORT advances). The caller reads PICKED.
NEXT_PORT=${PORT_BASE:?set PORT_BASE before sourcing benches/lib.sh}
PICKED=""
# shellcheck disable=SC2034
pick_port() {
    local i p
    for ((i = 0; i < 200; i++)); do
        p=$NEXT_PORT
        NEXT_PORT=$((NEXT_PORT + 1))
        if ! port_in_use "$p"; then
            PICKED=$p
            return 0
        fi
    done
    die "no free port found from $PORT_BASE"
}

# nginx needs writable temp paths when run as non-root; Debian compiles in
# absolute ones under /var/lib/nginx. Point them into the temp dir (only for
# the modules this nginx actually has).
nginx_temp_paths() {
    local dir=$1 v m
    v=$(nginx -V 2>&1)
    mkdir -p "$dir/tmp"
    {
        echo "client_body_temp_path $dir/tmp/body;"
        for m in proxy fastcgi uwsgi scgi; do
            [[ $v == *"--without-http_${m}_module"* ]] || echo "${m}_temp_path $dir/tmp/$m;"
        done
    } >"$dir/temp_paths.conf"
}

# start_json_backend PORT SIZE: nginx (one worker, core 1) serving a JSON document of about
# SIZE bytes (benches/peers/json_doc.py) at /data.json, as application/json with its
# Content-Length, and "hello world" at / for wait_ready; the document is $WORK/www/data.json,
# nginx's files in $WORK/backend. Waits until it answers; adds its pid to PIDS.
start_json_backend() {
    local port=$1
    mkdir -p "$WORK/www" "$WORK/backend"
    python3 "$ROOT/benches/peers/json_doc.py" "$2" "$WORK/www/data.json"
    # nginx's workers run as nobody when the script runs as root: they must read the document.
    chmod a+rx "$WORK" "$WORK/www"
    chmod a+r "$WORK/www/data.json"
    nginx_temp_paths "$WORK/backend"
    cat >"$WORK/backend/nginx.conf" <<CONF
daemon off;
worker_processes 1;
pid $WORK/backend/nginx.pid;
error_log $WORK/backend/error.log warn;
events { worker_connections 4096; }
http {
    include $WORK/backend/temp_paths.conf;
    access_log off;
    keepalive_requests 1000000;
    types { application/json json; }
    server {
        listen 127.0.0.1:$port backlog=4096;
        root $WORK/www;
        location = / { return 200 "hello world"; }
    }
}
CONF
    taskset -c 1 nginx -p "$WORK/backend" -c "$WORK/backend/nginx.conf" >"$WORK/backend/out.log" 2>&1 &
    PIDS+=($!)
    wait_ready backend "$port" "$!" "$WORK/backend/error.log"
}

wait_ready() { # NAME PORT PID LOGFILE [PATH, default /]
    local i body
    for ((i = 0; i < 50; i++)); do
        kill -0 "$3" 2>/dev/null || {
            cat "$4" >&2 2>/dev/null || true
            die "$1 exited during startup (log above: $4)"
        }
        if body=$(curl -s --max-time 1 "http://127.0.0.1:$2${5:-/}" 2>/dev/null) && [[ $body == "hello world" ]]; then
            kill -0 "$3" 2>/dev/null || continue # loop top reports the exit
            return 0
        fi
        sleep 0.1
    done
    cat "$4" >&2 2>/dev/null || true
    die "$1 not answering 'hello world' on 127.0.0.1:$2${5:-/} after 5 s"
}

# "busy0 total0 busy1 total1": jiffies of cores 0 and 1 from /proc/stat
# (busy = user+nice+system+irq+softirq+steal; total adds idle+iowait).
core_jiffies() {
    awk '$1 == "cpu0" || $1 == "cpu1" { b = $2 + $3 + $4 + $7 + $8 + $9; printf "%d %d ", b, b + $5 + $6 } END { print "" }' /proc/stat
}

# "steal0 total0 steal1 total1": jiffies of cores 0 and 1 that the hypervisor gave to another
# guest (/proc/stat's steal), and all jiffies. On a shared VM this is the neighbours' load.
core_steal_jiffies() {
    awk '$1 == "cpu0" || $1 == "cpu1" { t = 0; for (i = 2; i <= 9; i++) t += $i; printf "%d %d ", $9, t } END { print "" }' /proc/stat
}

# busy% of core 0 and core 1 between two core_jiffies snapshots (or the steal% between two
# core_steal_jiffies snapshots: the same division)
core_busy() { # "SNAP0" "SNAP1"
    awk -v a="$1" -v b="$2" 'BEGIN {
        split(a, x, " "); split(b, y, " ")
        printf "%.0f %.0f\n", (y[2] > x[2]) ? 100 * (y[1] - x[1]) / (y[2] - x[2]) : 0,
            (y[4] > x[4]) ? 100 * (y[3] - x[3]) / (y[4] - x[4]) : 0
    }'
}

# core_busy_1s: "BUSY0 BUSY1", the % busy of cores 0 and 1 over the next second.
core_busy_1s() {
    local j0
    j0=$(core_jiffies)
    sleep 1
    core_busy "$j0" "$(core_jiffies)"
}

affinity() { taskset -pc "$1" 2>/dev/null | awk -F': ' '{print $2}'; }

# Convert a wrk time ("812.00us", "1.23ms", "2.00s", "1.00m", "1.00h") to us.
to_us() {
    awk -v t="$1" 'BEGIN {
        n = t + 0; u = t; sub(/^[0-9.]+/, "", u)
        f = (u == "us") ? 1 : (u == "ms") ? 1e3 : (u == "s") ? 1e6 : (u == "m") ? 6e7 : (u == "h") ? 3.6e9 : -1
        if (f < 0) { print "nan"; exit }
        printf "%.0f\n", n * f
    }'
}

# stop_all PID...: stops each process and its direct children (an nginx master's
# worker): SIGTERM first, so nginx masters stop their workers, then SIGKILL for
# whatever is still alive after 3 s.
stop_all() {
    local all=() pid c i alive
    for pid in "$@"; do
        [[ -n $pid ]] || continue
        all+=("$pid")
        while read -r c; do
            if [[ -n $c ]]; then all+=("$c"); fi
        done < <(children "$pid")
    done
    ((${#all[@]})) || return 0
    for pid in "${all[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for ((i = 0; i < 30; i++)); do
        alive=0
        for pid in "${all[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for pid in "${all[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

# install_missing "PACKAGES" CMD...: when any CMD is missing, installs the Debian PACKAGES with
# apt-get (as root; otherwise dies saying what to install).
install_missing() {
    local pkgs=$1 missing=() t
    shift
    for t in "$@"; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
    ((${#missing[@]})) || return 0
    [[ $(id -u) -eq 0 ]] || die "missing ${missing[*]}; run as root or: apt-get install -y $pkgs"
    log "installing $pkgs (missing: ${missing[*]})"
    apt-get update -qq
    local list
    read -r -a list <<<"$pkgs"
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${list[@]}"
}

# require CMD...: dies naming the first command not found.
require() {
    local t
    for t in "$@"; do command -v "$t" >/dev/null 2>&1 || die "required tool '$t' not found"; done
}

# start_wrk PORT DURATION OUTFILE: starts wrk -t1 -c$CONNS --latency on core 1 against the port,
# its output in OUTFILE; $WRK_PID names it while it runs (for cleanup). wait_wrk OUTFILE waits
# for it and dies with that output if wrk failed. run_wrk PORT DURATION OUTFILE does both.
start_wrk() {
    taskset -c 1 wrk -t1 -c"$CONNS" -d"$2" --latency "http://127.0.0.1:$1/" >"$3" 2>&1 &
    WRK_PID=$!
}
wait_wrk() {
    local rc=0
    wait "$WRK_PID" || rc=$?
    WRK_PID=""
    if ((rc != 0)); then
        cat "$1" >&2
        die "wrk failed (rc=$rc)"
    fi
}
run_wrk() {
    start_wrk "$1" "$2" "$3"
    wait_wrk "$3"
}

# describe_procs NAME...: one line per process under test (from the PID_OF, VERSION and PORT
# arrays): its pids, threads and allowed cores; then a warning if the cores were busy before
# the start ($IDLE_BUSY0, $IDLE_BUSY1).
describe_procs() {
    local name tree q aff thr
    for name in "$@"; do
        tree=$(proc_tree "${PID_OF[$name]}" | tr '\n' ' ')
        aff="" thr=""
        for q in $tree; do
            aff+="$(affinity "$q") "
            thr+="$(awk '/^Threads:/ {print $2}' "/proc/$q/status" 2>/dev/null) "
        done
        echo "           $name ${VERSION[$name]} 127.0.0.1:${PORT[$name]} pids [ ${tree}] threads [ ${thr}] affinity [ ${aff}]"
    done
    if ((IDLE_BUSY0 > 10 || IDLE_BUSY1 > 10)); then
        log "WARNING: cores busy before start (core0 ${IDLE_BUSY0}%, core1 ${IDLE_BUSY1}%) - something else is running; numbers will be noisy"
    fi
}

# stats NAME COLUMN -> "median min max" of that column of $RAW (tab-separated, the name in column
# 2) over the rounds.
stats() {
    awk -F'\t' -v p="$1" -v c="$2" '$2 == p {print $c}' "$RAW" | sort -g |
        awk '{ a[NR] = $1 } END {
            if (NR == 0) { print "nan nan nan"; exit }
            m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
            print m, a[1], a[NR]
        }'
}

# raw_section CAPTION: the Markdown for the rounds' raw rows ($RAW) under CAPTION, as the end
# of a report ("Per round (round, tool, req/s, ...):").
raw_section() {
    echo
    echo "$1"
    echo
    echo '```'
    cat "$RAW"
    echo '```'
}

# publish_report MD: prints the Markdown report MD and copies it to $OUT_MD.
publish_report() {
    echo
    cat "$1"
    if mkdir -p "$(dirname -- "$OUT_MD")" && cp "$1" "$OUT_MD"; then
        log "report written to $OUT_MD"
    else
        log "WARNING: could not write $OUT_MD"
    fi
}

# install_cleanup: on exit, Ctrl-C or TERM, stop every process the script's own `running_pids`
# prints (with their children), wait for them, remove $WORK (remove_work) and exit with the
# script's status.
install_cleanup() {
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    local pids
    read -r -a pids < <(running_pids)
    stop_all "${pids[@]}"
    wait 2>/dev/null || true
    remove_work
    exit "$rc"
}

# remove_work: the temp dir $WORK goes, unless KEEP_TMP=1.
remove_work() {
    if [[ $KEEP_TMP == 1 ]]; then
        log "temp dir kept: $WORK"
    else
        rm -rf -- "$WORK"
    fi
}

# start_peer P PINLB_TOML: renders proxy P's config (nginx, haproxy or pinlb; pinlb's
# from PINLB_TOML, checked with `pinlb check` first) into $WORK/P, starts it on
# core 0 and waits until it answers. Uses the caller's PORT, PEERS_DIR, PINLB
# and WORK; fills PID_OF[P], LOGF[P] and VERSION[P], and adds the pid to PIDS.
# shellcheck disable=SC2004,SC2034 # those are the caller's associative arrays, keyed by name
start_peer() {
    local p=$1 toml=$2 d="$WORK/$1"
    mkdir -p "$d"
    LOGF[$p]="$d/stdout.log"
    case $p in
    nginx)
        nginx_temp_paths "$d"
        render "$PEERS_DIR/nginx.conf" "$d/nginx.conf" "${PORT[$p]}" "$d"
        taskset -c 0 nginx -p "$d" -c "$d/nginx.conf" -e "$d/error.log" >"${LOGF[$p]}" 2>&1 &
        PID_OF[$p]=$!
        LOGF[$p]="$d/error.log"
        VERSION[$p]=$(nginx -v 2>&1 | awk -F'/' '{print $2}')
        ;;
    haproxy)
        render "$PEERS_DIR/haproxy.cfg" "$d/haproxy.cfg" "${PORT[$p]}" "$d"
        taskset -c 0 haproxy -db -f "$d/haproxy.cfg" >"${LOGF[$p]}" 2>&1 &
        PID_OF[$p]=$!
        VERSION[$p]=$(haproxy -v 2>&1 | awk 'NR == 1 {print $3}')
        ;;
    pinlb*)
        # pinlb-base: plain pinlb's configuration on another binary ($PINLB_BASE), to
        # compare a change against the build before it in the same run.
        local bin=$PINLB
        if [[ $p == pinlb-base ]]; then
            bin=${PINLB_BASE:?pinlb-base needs PINLB_BASE=path/to/the/other/pinlb}
            toml="$PEERS_DIR/pinlb.toml"
        fi
        render "$toml" "$d/pinlb.toml" "${PORT[$p]}" "$d"
        "$bin" check -c "$d/pinlb.toml" >"$d/check.log" 2>&1 || {
            cat "$d/check.log" >&2
            die "pinlb check rejected $toml (rendered: $d/pinlb.toml); this binary may predate its keys - or leave pinlb out of PEERS"
        }
        RUST_LOG=warn taskset -c 0 "$bin" serve -c "$d/pinlb.toml" >"${LOGF[$p]}" 2>&1 &
        PID_OF[$p]=$!
        VERSION[$p]=$("$bin" --version 2>&1 | awk 'NR == 1 {print $NF}')
        ;;
    esac
    PIDS+=("${PID_OF[$p]}")
    wait_ready "$p" "${PORT[$p]}" "${PID_OF[$p]}" "${LOGF[$p]}"
}

# host_facts: sets CPU_MODEL and COMMIT (the short hash, +dirty with local changes)
# for a report's header.
# shellcheck disable=SC2034 # read by the caller
host_facts() {
    CPU_MODEL=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
    if COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null); then
        git -C "$ROOT" diff --quiet HEAD 2>/dev/null || COMMIT="$COMMIT+dirty"
    else
        COMMIT="none (no git HEAD)"
    fi
}

# child_times: sets CHILD_TIMES to the user and system time of this shell's waited-for children
# so far, as bash's `times` prints them on its second line ("0m1.234s 0m0.567s"). `times` must
# run in the caller's shell, not in a $(...) subshell, and nothing here may start a child: its
# CPU time would count. Writes $WORK/times.
child_times() {
    times >"$WORK/times"
    { read -r _ && read -r CHILD_TIMES; } <"$WORK/times"
}

# cpu_s_between BEFORE AFTER: seconds between two CHILD_TIMES values.
cpu_s_between() {
    awk -v a="$1" -v b="$2" 'function s(t,   n, i, p, f, sum) {
            n = split(t, f, " "); sum = 0
            for (i = 1; i <= n; i++) { split(f[i], p, "m"); sub(/s$/, "", p[2]); sum += p[1] * 60 + p[2] }
            return sum
        }
        BEGIN { printf "%.3f\n", s(b) - s(a) }'
}

# run_timed LOG CMD...: runs CMD in the background with its stdout and stderr in LOG (its pid in
# GEN_PID meanwhile, for the caller's cleanup), waits for it, and sets RUN_CPU_S to the CPU
# seconds it used (its utime+stime, all threads, from `times`); dies showing LOG if it failed.
run_timed() {
    local log=$1 before rc=0
    shift
    child_times
    before=$CHILD_TIMES
    "$@" >"$log" 2>&1 &
    GEN_PID=$!
    wait "$GEN_PID" || rc=$?
    GEN_PID=""
    child_times
    if ((rc != 0)); then
        cat "$log" >&2 2>/dev/null || true
        die "$* failed (rc=$rc)"
    fi
    RUN_CPU_S=$(cpu_s_between "$before" "$CHILD_TIMES")
}

# json_first KEY FILE: the first value of "KEY": in pinlb bench's pretty-printed JSON. A
# target's own figures come before its per-round ones; with one target, they are its.
json_first() {
    awk -v k="\"$1\":" '$1 == k { v = $2; sub(/,$/, "", v); print v; exit }' "$2"
}
