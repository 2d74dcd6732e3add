#!/usr/bin/env bash
# benches/buffering.sh - does a slow client hold a backend? (issue 30's buffering bars)
#
# One pinlb worker (core 0) with two listeners in front of the same Python backend (core 1):
# `buffered` (an upstream with [upstream.NAME.buffering]) and `streamed` (the same backend
# without it). Rounds alternate the two, so both see the same machine:
#   upload   a client sends SIZE bytes at RATE bytes/s; the backend reports how long it held
#            the request (its first byte to its last). Bar: under 50 ms buffered.
#   download a client reads BIG bytes at READ_RATE bytes/s (a 16 KiB receive buffer, so the
#            kernel does not read ahead for it); the time from the backend's last byte written
#            to pinlb's backend_in_flight gauge reaching 0 (/metrics every 10 ms). Bar: under
#            1 s buffered.
#   memory   CLIENTS clients upload SIZE at RATE at once through the buffered listener: pinlb's
#            RSS before and at mid-upload, the backend connections open meanwhile (0 expected),
#            and the RSS per client scaled to 1,000 clients.
# Prints a median per bar and mode (max for the release time), and pinlb's RSS growth.
#
# Usage: bash benches/buffering.sh [PINLB_BINARY]   (default target/release/pinlb)
#   SIZE=1048576 RATE=10240 (the issue's 1 MiB at 10 KiB/s: 100 s an upload), BIG=10485760
#   READ_RATE=102400 (10 MiB at 100 KiB/s: 100 s a read), ROUNDS=3, CLIENTS=200,
#   MEMORY=64KiB (the buffering memory bound), PORT_BASE=18330, KEEP_TMP=1 keeps the temp dir.
#   A short smoke run: SIZE=65536 RATE=65536 BIG=2097152 READ_RATE=1048576 ROUNDS=1 CLIENTS=20
# Needs: python3, taskset, curl.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLB=${1:-$ROOT/target/release/pinlb}
SIZE=${SIZE:-1048576}
RATE=${RATE:-10240}
BIG=${BIG:-10485760}
READ_RATE=${READ_RATE:-102400}
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-200}
MEMORY=${MEMORY:-64KiB}
KEEP_TMP=${KEEP_TMP:-0}
WORK=$(mktemp -d)
PIDS=()
log() { printf '[buffering] %s\n' "$*" >&2; }
die() { printf '[buffering] ERROR: %s\n' "$*" >&2; exit 1; }
PORT_BASE=${PORT_BASE:-18330}
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
running_pids() { echo "${PIDS[@]}"; }
install_cleanup
require python3 taskset curl

CORES=$(nproc)
BACKEND_CORE=$((CORES > 1 ? 1 : 0))
CLIENT_CORE=$((CORES > 2 ? 2 : BACKEND_CORE))
pick_port
BACKEND_PORT=$PICKED
pick_port
BUFFERED=$PICKED
pick_port
STREAMED=$PICKED
pick_port
ADMIN=$PICKED

# The backend: one request at a time per connection, Content-Length bodies; `GET /big/N`
# answers N bytes, anything else `hello world`. One JSON line per event in backend.jsonl.
cat >"$WORK/backend.py" <<'PY'
import asyncio, json, sys, time
port, out = int(sys.argv[1]), open(sys.argv[2], "a", buffering=1)
conns = 0
open_now = 0
def note(**kv):
    kv["t"] = time.monotonic()
    out.write(json.dumps(kv) + "\n")
async def serve(r, w):
    global conns, open_now
    conns += 1
    open_now += 1
    cid = conns
    note(event="open", conn=cid, open=open_now)
    try:
        while True:
            first = await r.read(1)
            if not first:
                return
            t0 = time.monotonic()
            head = first + await r.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            length = 0
            for l in lines[1:]:
                if l.lower().startswith("content-length:"):
                    length = int(l.split(":", 1)[1])
            if length:
                await r.readexactly(length)
            note(event="request", conn=cid, path=path, first=t0, last=time.monotonic(), length=length)
            if path.startswith("/big/"):
                n = int(path[5:])
                w.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % n)
                piece = b"x" * 65536
                left = n
                while left:
                    k = min(left, len(piece))
                    w.write(piece[:k])
                    left -= k
                    await w.drain()
                note(event="written", conn=cid, path=path)
            else:
                w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\nhello world")
                await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        open_now -= 1
        note(event="close", conn=cid, open=open_now)
        w.close()
async def main():
    s = await asyncio.start_server(serve, "127.0.0.1", port, backlog=4096)
    async with s:
        await s.serve_forever()
asyncio.run(main())
PY

# The clients: paced uploads and paced reads.
cat >"$WORK/client.py" <<'PY'
import asyncio, socket, sys, time
mode, port = sys.argv[1], int(sys.argv[2])
async def upload(size, rate):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"POST /up HTTP/1.1\r\nHost: app\r\nContent-Length: %d\r\n\r\n" % size)
    per = max(1, rate // 50)
    sent, start = 0, time.monotonic()
    while sent < size:
        k = min(per, size - sent)
        w.write(b"u" * k)
        await w.drain()
        sent += k
        # Paced: the next piece at its place on the rate's clock.
        await asyncio.sleep(max(0.0, start + sent / rate - time.monotonic()))
    head = await r.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    await r.readexactly(11)
    w.close()
async def download(n, rate):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    r, w = await asyncio.open_connection(sock=s, limit=65536)
    w.write(b"GET /big/%d HTTP/1.1\r\nHost: app\r\n\r\n" % n)
    head = await r.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    got, start, per = 0, time.monotonic(), max(1, rate // 50)
    while got < n:
        got += len(await r.readexactly(min(per, n - got)))
        await asyncio.sleep(max(0.0, start + got / rate - time.monotonic()))
    print(time.monotonic())
    w.close()
def watch(admin, upstream, events, mark):
    """Waits for the backend's last byte written (its event after line `mark`), then polls
    /metrics every 10 ms until the upstream's backend_in_flight is 0; prints the ms between."""
    import json, urllib.request
    deadline = time.monotonic() + 3600
    written = None
    while written is None and time.monotonic() < deadline:
        for l in open(events).read().splitlines()[mark:]:
            e = json.loads(l)
            if e["event"] == "written":
                written = e["t"]
        if written is None:
            time.sleep(0.005)
    want = 'pinlb_backend_in_flight{upstream="%s"' % upstream
    while time.monotonic() < deadline:
        body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % admin).read().decode()
        now = time.monotonic()
        if any(l.startswith(want) and l.split()[-1] == "0" for l in body.splitlines()):
            print((now - written) * 1000)
            open(events + ".written", "w").write(str(written))
            return
        time.sleep(0.01)
async def many(count, size, rate):
    await asyncio.gather(*(upload(size, rate) for _ in range(count)))
if mode == "upload":
    asyncio.run(upload(int(sys.argv[3]), int(sys.argv[4])))
elif mode == "watch":
    watch(port, sys.argv[3], sys.argv[4], int(sys.argv[5]))
elif mode == "download":
    asyncio.run(download(int(sys.argv[3]), int(sys.argv[4])))
else:
    asyncio.run(many(int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
PY

taskset -c "$BACKEND_CORE" python3 "$WORK/backend.py" "$BACKEND_PORT" "$WORK/backend.jsonl" \
    >"$WORK/backend.log" 2>&1 &
PIDS+=($!)
wait_ready backend "$BACKEND_PORT" "$!" "$WORK/backend.log"

mkdir -p "$WORK/spool"
cat >"$WORK/pinlb.toml" <<EOF
[runtime]
cpus = [0]

[limits]
max_body = "16MiB"
max_connections = 10000

[admin]
address = "127.0.0.1:$ADMIN"

[[listener]]
address = "127.0.0.1:$BUFFERED"
upstream = "buffered"

[[listener]]
address = "127.0.0.1:$STREAMED"
upstream = "streamed"

[upstream.buffered]
backends = [{ address = "127.0.0.1:$BACKEND_PORT" }]

[upstream.buffered.buffering]
memory = "$MEMORY"
temp_dir = "$WORK/spool"

[upstream.streamed]
backends = [{ address = "127.0.0.1:$BACKEND_PORT" }]
EOF
taskset -c 0 "$PINLB" serve -c "$WORK/pinlb.toml" 2>"$WORK/pinlb.log" &
PINLB_PID=$!
PIDS+=("$PINLB_PID")
wait_ready pinlb "$BUFFERED" "$PINLB_PID" "$WORK/pinlb.log"
wait_ready pinlb "$STREAMED" "$PINLB_PID" "$WORK/pinlb.log"

client() { taskset -c "$CLIENT_CORE" python3 "$WORK/client.py" "$@"; }
in_flight() { # UPSTREAM
    curl -s "http://127.0.0.1:$ADMIN/metrics" |
        awk -v u="upstream=\"$1\"" 'index($0, "pinlb_backend_in_flight{") == 1 && index($0, u) { print $2 }'
}
rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$PINLB_PID/status"; }

: >"$WORK/results.txt"
for round in $(seq 1 "$ROUNDS"); do
    for mode in buffered streamed; do
        port=$([ "$mode" = buffered ] && echo "$BUFFERED" || echo "$STREAMED")
        log "round $round $mode: upload $SIZE B at $RATE B/s"
        mark=$(wc -l <"$WORK/backend.jsonl")
        client upload "$port" "$SIZE" "$RATE"
        tail -n +"$((mark + 1))" "$WORK/backend.jsonl" | python3 -c '
import json, sys
for l in sys.stdin:
    e = json.loads(l)
    if e["event"] == "request" and e["path"] == "/up":
        print("upload", sys.argv[1], (e["last"] - e["first"]) * 1000)
' "$mode" >>"$WORK/results.txt"

        log "round $round $mode: download $BIG B at $READ_RATE B/s"
        mark=$(wc -l <"$WORK/backend.jsonl")
        client download "$port" "$BIG" "$READ_RATE" >"$WORK/read_done" &
        reader=$!
        # The backend's last byte, then the gauge's 0, polled every 10 ms.
        client watch "$ADMIN" "$mode" "$WORK/backend.jsonl" "$mark" >"$WORK/release"
        wait "$reader"
        after=$(python3 -c "print(($(cat "$WORK/read_done") - $(cat "$WORK/backend.jsonl.written")) * 1000)")
        echo "release $mode $(cat "$WORK/release") client_done_after_ms $after" >>"$WORK/results.txt"
    done
done

log "memory: $CLIENTS clients uploading $SIZE B at $RATE B/s at once (buffered)"
before=$(rss_kib)
mark=$(wc -l <"$WORK/backend.jsonl")
client many "$BUFFERED" "$CLIENTS" "$SIZE" "$RATE" &
many=$!
# Mid-upload: half the upload's time.
python3 -c "import time; time.sleep($SIZE / $RATE / 2)"
during=$(rss_kib)
spooled=$(find "/proc/$PINLB_PID/fd" -lname "$WORK/spool/*" 2>/dev/null | wc -l)
open_backend=$(tail -n +"$((mark + 1))" "$WORK/backend.jsonl" | python3 -c '
import json, sys
n = 0
for l in sys.stdin:
    e = json.loads(l)
    if e["event"] in ("open", "close"):
        n = e["open"]
print(n)')
wait "$many"
echo "memory $CLIENTS $before $during $spooled $open_backend" >>"$WORK/results.txt"

python3 - "$WORK/results.txt" "$SIZE" "$RATE" "$BIG" "$READ_RATE" "$MEMORY" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
size, rate, big, read_rate, memory = sys.argv[2:7]
def med(kind, mode):
    v = [float(r[2]) for r in rows if r[0] == kind and r[1] == mode]
    return statistics.median(v), max(v), len(v)
print()
print(f"upload {size} B at {rate} B/s; download {big} B at {read_rate} B/s; memory bound {memory}")
print()
print("| bar | buffered (median / max) | streamed (median / max) | rounds |")
print("|---|---:|---:|---:|")
for kind, what in [("upload", "backend held the upload, ms"), ("release", "backend's last byte to in-flight 0, ms")]:
    b, s = med(kind, "buffered"), med(kind, "streamed")
    print(f"| {what} | {b[0]:.1f} / {b[1]:.1f} | {s[0]:.1f} / {s[1]:.1f} | {b[2]} |")
m = [r for r in rows if r[0] == "memory"][0]
clients, before, during, spooled, open_backend = map(int, m[1:])
per = (during - before) / clients
print()
print(f"{clients} slow uploads at once: pinlb RSS {before} KiB -> {during} KiB mid-upload "
      f"({per:.1f} KiB per client; {per * 1000 / 1024:.1f} MiB for 1,000), "
      f"{spooled} temporary files open, {open_backend} backend connections open")
held = med("upload", "buffered")[1]
freed = med("release", "buffered")[1]
print(f"bars: upload held {held:.1f} ms ({'under' if held < 50 else 'OVER'} 50 ms); "
      f"release {freed:.0f} ms ({'under' if freed < 1000 else 'OVER'} 1 s)")
PY
if [ "$KEEP_TMP" = 1 ]; then log "kept $WORK"; fi
