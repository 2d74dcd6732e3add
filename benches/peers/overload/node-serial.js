// The Node.js backend of benches/overload_follow.sh (issue 47): serves ONE request at a time,
// each taking $WORK_MS milliseconds, so that its latency grows with every request pinlb sends
// it beyond the first (they wait here, in arrival order) and its capacity is 1000 / WORK_MS
// requests a second. Requests wait in a FIFO; the one at its head is answered "hello world"
// (res.end with a string: Content-Length, keep-alive) WORK_MS after its turn came. A request
// whose client left while it waited is dropped without its work.
//   WORK=sleep (default): the turn is a timer (no CPU: the host's cores stay free for the proxy)
//   WORK=busy: the turn is a busy loop of WORK_MS on this process's core
// Control, answered at once (not queued), meant to be sent to this process directly, not
// through the proxy:
//   GET /__work?ms=N   sets the time per request to N ms (a number > 0, at most 10000), for
//                      every request whose turn starts from now on
//   GET /__work        reads it
// Both answer {"ms":N,"waiting":W,"served":S}. Listens on 127.0.0.1:$PORT with Node's default
// backlog (511).
const http = require('http');
const port = Number(process.env.PORT);
const busy = (process.env.WORK || 'sleep') === 'busy';
let ms = Number(process.env.WORK_MS || 1);
if (!(ms > 0 && ms <= 10000)) throw new Error(`WORK_MS must be in (0, 10000], got ${process.env.WORK_MS}`);
if (!['sleep', 'busy'].includes(process.env.WORK || 'sleep')) throw new Error(`WORK must be sleep or busy`);

const waiting = [];
let head = 0; // waiting[head] is the next turn (a shift() per request would copy the array)
let serving = false;
let served = 0;

function next() {
  while (!serving && head < waiting.length) {
    const res = waiting[head];
    waiting[head++] = undefined;
    if (head > 1024 && head * 2 > waiting.length) {
      waiting.splice(0, head);
      head = 0;
    }
    if (res.destroyed || res.socket === null || res.socket.destroyed) continue; // its client left
    serving = true;
    const done = () => {
      serving = false;
      served++;
      res.end('hello world');
      next();
    };
    if (busy) {
      const end = process.hrtime.bigint() + BigInt(Math.round(ms * 1e6));
      while (process.hrtime.bigint() < end) {}
      setImmediate(done); // not done(): a long queue would recurse
    } else {
      setTimeout(done, ms);
    }
  }
}

http
  .createServer((req, res) => {
    if (req.url === '/__work' || req.url.startsWith('/__work?')) {
      const q = new URL(req.url, 'http://x').searchParams;
      if (q.has('ms')) {
        const n = Number(q.get('ms'));
        if (!(n > 0 && n <= 10000)) {
          res.writeHead(400);
          res.end(`ms must be a number in (0, 10000], got ${q.get('ms')}\n`);
          return;
        }
        ms = n;
      }
      res.setHeader('Content-Type', 'application/json');
      res.end(JSON.stringify({ ms, waiting: waiting.length - head + (serving ? 1 : 0), served }) + '\n');
      return;
    }
    waiting.push(res);
    next();
  })
  .listen(port, '127.0.0.1');
