// The Node.js backend of benches/ab_node.sh: "hello world\n" the way most Node apps answer,
// res.writeHead then res.end, which Node sends chunked (writeHead fixes the head before the
// body's length is known). Listens on 127.0.0.1:$PORT.
const http = require('http');
const port = Number(process.env.PORT);
http
  .createServer((req, res) => {
    res.writeHead(200, { 'Content-Type': 'text/plain' });
    res.end('hello world\n');
  })
  .listen(port, '127.0.0.1');
