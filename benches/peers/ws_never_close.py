# A WebSocket backend for benches (issue 28's CLOSE-WAIT check, benches/RESULTS.md): it echoes
# messages but never answers a close frame nor closes after the client's FIN.
# A WebSocket echo backend that never closes: answers the upgrade with 101, echoes frames'
# bytes back as they come (a raw echo of the client's masked frames would be invalid, so it
# re-frames each complete message unmasked), and on the client's FIN it does not close.
import asyncio, base64, hashlib, struct, sys

async def handle(r, w):
    head = await r.readuntil(b"\r\n\r\n")
    key = [l.split(b":",1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key")][0]
    acc = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    w.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    await w.drain()
    try:
        while True:
            h = await r.readexactly(2)
            op = h[0] & 0x0f; ln = h[1] & 0x7f
            if ln == 126: ln = struct.unpack(">H", await r.readexactly(2))[0]
            elif ln == 127: ln = struct.unpack(">Q", await r.readexactly(8))[0]
            mask = await r.readexactly(4) if h[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(await r.readexactly(ln)))
            if op == 8:
                continue  # a close frame: never answered
            hdr = bytes([0x80 | op]) + (bytes([ln]) if ln < 126 else bytes([126]) + struct.pack(">H", ln))
            w.write(hdr + data); await w.drain()
    except asyncio.IncompleteReadError:
        pass
    # The client's FIN: hold the connection open for ever (never close).
    await asyncio.sleep(3600)

async def main():
    srv = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    async with srv: await srv.serve_forever()
asyncio.run(main())
