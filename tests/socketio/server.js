// One socket.io server for tests/sticky.rs, long-polling only, on a port the kernel chooses on
// 127.0.0.1. Prints `listening PORT` once it accepts. `echo` events are acknowledged with the
// message and this server's ID (argv[2]), so the test sees which server held the session.
const http = require("http");
const { Server } = require("socket.io");

const id = process.argv[2] || "?";
const server = http.createServer();
const io = new Server(server, { transports: ["polling"] });
io.on("connection", (socket) => {
  socket.on("echo", (msg, ack) => ack({ msg, id }));
});
server.listen(0, "127.0.0.1", () => {
  console.log(`listening ${server.address().port}`);
});
// The test ends the process; a closed stdin (the test gone) ends it too.
process.stdin.on("end", () => process.exit(0));
process.stdin.resume();
