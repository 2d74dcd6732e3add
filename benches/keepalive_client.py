#!/usr/bin/env python3
"""A keep-alive HTTP/1.1 load client for benches/callgrind.sh (CLIENT=py or CLIENT=proxy-v2).

Opens CONNS connections to 127.0.0.1:PORT and sends GET / on each, one request at a time, for
SECONDS; with --proxy-v2 each connection begins with a PROXY protocol v2 header naming another
client (203.0.113.N), as a load balancer in front would send. Prints "N requests in S s" and
exits 1 on any connection closed early, so a count is only of requests on kept connections.

wrk can't send a PROXY header, and a proxy in front (HAProxy's send-proxy-v2) decides for
itself when to close its private server connections, which would put connects in the count.
"""
import argparse, asyncio, socket, struct, sys, time

SIG = b"\r\n\r\n\x00\r\nQUIT\n"

def v2_header(n: int) -> bytes:
    src = socket.inet_aton(f"203.0.113.{n % 250 + 1}")
    dst = socket.inet_aton("127.0.0.1")
    body = src + dst + struct.pack("!HH", 40000 + n, 80)
    return SIG + bytes([0x21, 0x11]) + struct.pack("!H", len(body)) + body

async def one(port, n, deadline, proxy, counts):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if proxy:
        writer.write(v2_header(n))
    req = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"
    while time.monotonic() < deadline:
        writer.write(req)
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
            if line.lower().startswith(b"connection:") and b"close" in line.lower():
                raise SystemExit(f"connection {n}: the proxy closed it (Connection: close)")
        await reader.readexactly(length)
        counts[n] += 1
    writer.close()

async def main():
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("--conns", type=int, default=16)
    p.add_argument("--seconds", type=float, default=4)
    p.add_argument("--proxy-v2", action="store_true")
    a = p.parse_args()
    counts = [0] * a.conns
    start = time.monotonic()
    deadline = start + a.seconds
    await asyncio.gather(*(one(a.port, n, deadline, a.proxy_v2, counts) for n in range(a.conns)))
    print(f"{sum(counts)} requests in {time.monotonic() - start:.2f} s")

asyncio.run(main())
