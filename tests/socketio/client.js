// A socket.io client for tests/sticky.rs: connects to argv[2] over long-polling only, with a
// cookie jar (withCredentials), emits `echo` and prints what came back. Exit status: 0 with
// `echo {...}` on success; 1 with `connect_error ...` when the handshake fails (a session the
// server answering does not know: `Session ID unknown`); 2 when nothing happened in time.
const { io } = require("socket.io-client");

const socket = io(process.argv[2], {
  transports: ["polling"],
  withCredentials: true,
  reconnection: false,
  forceNew: true,
  timeout: 5000,
});
const deadline = setTimeout(() => {
  console.log("timeout");
  process.exit(2);
}, 15000);
socket.on("connect", () => {
  socket.timeout(5000).emit("echo", "hello", (err, reply) => {
    if (err) {
      console.log(`no echo: ${err.message}`);
      process.exit(3);
    }
    console.log(`echo ${JSON.stringify(reply)}`);
    clearTimeout(deadline);
    socket.close();
    process.exit(0);
  });
});
socket.on("connect_error", (e) => {
  const said = e.context && e.context.responseText ? e.context.responseText : e.description;
  console.log(`connect_error ${e.message} ${JSON.stringify(said ?? "")}`);
  process.exit(1);
});
