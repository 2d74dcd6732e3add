// The Node.js backend of benches/overload.sh (issue 27): a plain http.createServer app whose
// handler spins a busy loop standing in for work, then answers "hello world" (res.end with a
// string: Content-Length, keep-alive). Node's default listen backlog (511). Listens on
// 127.0.0.1:$PORT; the loop count is $BUSY_LOOP (default 180000, the issue's).
const http = require('http');
const port = Number(process.env.PORT);
const loops = Number(process.env.BUSY_LOOP || 180000);
http
  .createServer((req, res) => {
    for (var i = 0; i < loops; i++) {
      var j = i / 3;
    }
    res.end('hello world');
  })
  .listen(port, '127.0.0.1');
