#!/usr/bin/env python3
"""benches/tls_idle.py PORT N SECONDS: opens N TLS connections to 127.0.0.1:PORT (SNI
bench.test, no verification), makes one keep-alive GET on each, prints "ready N", and holds
them idle for SECONDS. For measuring memory per idle TLS connection (docs/performance.md)."""
import ssl, socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
conns = []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    t = ctx.wrap_socket(s, server_hostname="bench.test")
    t.sendall(b"GET / HTTP/1.1\r\nHost: bench.test\r\n\r\n")
    got = b""
    while not got.endswith(b"hello world\n"):
        d = t.recv(4096)
        if not d:
            raise SystemExit("closed")
        got += d
    conns.append(t)
print("ready", len(conns), flush=True)
time.sleep(float(sys.argv[3]))
