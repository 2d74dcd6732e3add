// The Node.js backend of benches/cache.sh (issue 50): benches/peers/overload/node-busy.js's app
// (a busy loop of $BUSY_LOOP iterations per request standing in for work) answering with
// `Cache-Control: max-age=$MAX_AGE`, so a cache in front may keep each answer that long.
// `/big/...` answers 64 KiB (for the memory run); `/__count` answers, uncached and without the
// loop, how many requests this process has served, for the bench to read directly.
// Listens on 127.0.0.1:$PORT.
const http = require('http');
const port = Number(process.env.PORT);
const loops = Number(process.env.BUSY_LOOP || 180000);
const maxAge = Number(process.env.MAX_AGE || 1);
const big = 'x'.repeat(64 * 1024);
let served = 0;
http
  .createServer((req, res) => {
    if (req.url === '/__count') {
      res.writeHead(200, { 'Cache-Control': 'no-store', 'Content-Type': 'text/plain' });
      res.end(String(served));
      return;
    }
    served++;
    for (var i = 0; i < loops; i++) {
      var j = i / 3;
    }
    res.writeHead(200, {
      'Cache-Control': 'max-age=' + maxAge,
      'Content-Type': 'text/plain',
    });
    res.end(req.url.startsWith('/big/') ? big : 'hello world');
  })
  .listen(port, '127.0.0.1');
