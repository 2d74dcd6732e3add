//! A client connection's socket, plain or TLS: the few operations `downstream::h1` needs (read what
//! is there into a buffer, write everything, notice a client gone, close), and the TLS
//! handshake.
//!
//! TLS is rustls's [`ServerConnection`] driven by hand on the same non-blocking socket, with the
//! same readiness calls as a plain connection, rather than through an `AsyncRead`/`AsyncWrite`
//! wrapper: so that a plain connection's operations stay exactly what they were, and so that an
//! idle TLS connection parks like a plain one (its socket in the parking epoll set, its rustls
//! state boxed beside it, see `idle`).

use std::borrow::Borrow;
use std::cell::RefCell;
use std::io::{self, IoSlice, Write};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use rustls::ServerConnection;
use rustls::server::Acceptor;
use socket2::SockRef;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

use crate::downstream::idle::READ_BUFFER;
use crate::sys::socket::{poll_read_tcp, try_writev};
use crate::tls::client_identity::ClientIdentity;
use crate::tls::server::Terminator;
use crate::upstream::counters::{ListenerStats, Refusal, TlsFailure};

/// A client connection's socket.
pub(crate) enum DownstreamStream {
    Plain(TcpStream),
    /// Boxed: a plain connection's task need not carry the room for rustls's state.
    Tls(Box<TlsStream>),
}

/// A TLS connection past its handshake.
pub(crate) struct TlsStream {
    tcp: TcpStream,
    /// Borrowed only inside one synchronous call, never across an await: the connection's
    /// reads, writes and watch never run at once, but they are separate futures.
    conn: RefCell<ServerConnection>,
    /// On a listener with `client_ca`: what the client's certificate says (or that it sent
    /// none), read once after the handshake.
    client: Option<Arc<ClientIdentity>>,
}

/// A parked TLS connection's rustls state, kept while its socket waits in the parking set.
pub(crate) struct TlsState(Box<ServerConnection>, Option<Arc<ClientIdentity>>);

/// What a client that is not waiting for its response did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stir {
    /// Closed the connection, or broke it.
    Gone,
    /// Sent bytes: of a next request, most likely.
    Sent,
}

fn tls_failed(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

fn busy() -> io::Error {
    io::Error::other("TLS state already in use")
}

impl DownstreamStream {
    /// The TCP socket under the connection.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            DownstreamStream::Plain(s) => s,
            DownstreamStream::Tls(t) => &t.tcp,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, DownstreamStream::Tls(_))
    }

    /// A TLS connection on which ALPN chose HTTP/2.
    pub fn is_h2(&self) -> bool {
        match self {
            DownstreamStream::Plain(_) => false,
            DownstreamStream::Tls(t) => t
                .conn
                .try_borrow()
                .is_ok_and(|c| c.alpn_protocol() == Some(crate::tls::server::H2)),
        }
    }

    /// A TLS connection whose handshake resumed a session.
    pub fn is_resumed(&self) -> bool {
        match self {
            DownstreamStream::Plain(_) => false,
            DownstreamStream::Tls(t) => t
                .conn
                .try_borrow()
                .is_ok_and(|c| c.handshake_kind() == Some(rustls::HandshakeKind::Resumed)),
        }
    }

    /// The socket and the TLS state, for parking.
    pub fn into_parts(self) -> (TcpStream, Option<TlsState>) {
        match self {
            DownstreamStream::Plain(s) => (s, None),
            DownstreamStream::Tls(t) => {
                let TlsStream { tcp, conn, client } = *t;
                (tcp, Some(TlsState(Box::new(conn.into_inner()), client)))
            }
        }
    }

    /// What the client's certificate says, on a listener with `client_ca`.
    pub fn client_identity(&self) -> Option<&Arc<ClientIdentity>> {
        match self {
            DownstreamStream::Plain(_) => None,
            DownstreamStream::Tls(t) => t.client.as_ref(),
        }
    }

    /// A connection back from parking.
    pub fn from_parts(tcp: TcpStream, tls: Option<TlsState>) -> DownstreamStream {
        match tls {
            None => DownstreamStream::Plain(tcp),
            Some(TlsState(conn, client)) => DownstreamStream::Tls(Box::new(TlsStream {
                tcp,
                conn: RefCell::new(*conn),
                client,
            })),
        }
    }

    /// Reads what the client sent into the spare room of `buf`; `Ok(0)` is the end of the
    /// stream.
    #[inline]
    pub fn poll_read_buf(
        &self,
        buf: &mut BytesMut,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(READ_BUFFER);
        }
        match self {
            DownstreamStream::Plain(s) => poll_read_tcp(s, buf, cx),
            DownstreamStream::Tls(t) => t.poll_read_buf(buf, cx),
        }
    }

    /// Writes all of `bufs`, waiting for room in the socket as needed.
    ///
    /// One future for both kinds, each waiting only on its socket's writability: a plain
    /// write is the loop it was before TLS, with no future nested in it.
    pub async fn write_all(&self, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        let stream = match self {
            DownstreamStream::Plain(s) => s,
            DownstreamStream::Tls(t) => {
                t.encrypt(bufs)?;
                // Bounded: every pass writes something, or waits for room, or fails.
                while !t.try_flush()? {
                    t.tcp.writable().await?;
                }
                return Ok(());
            }
        };
        // Bounded: every pass writes something, or waits for room, or fails.
        while !self.write_now(&mut bufs)? {
            stream.writable().await?;
        }
        Ok(())
    }

    /// Writes what of `bufs` a plain socket takes now, without waiting, and leaves `bufs` at
    /// what is left: `Ok(true)` when that is nothing. A TLS stream writes nothing here
    /// (`Ok(false)`): its records are made by [`Self::write_all`].
    #[inline]
    pub fn write_now(&self, bufs: &mut &mut [IoSlice<'_>]) -> io::Result<bool> {
        let DownstreamStream::Plain(stream) = self else {
            return Ok(false);
        };
        let mut left: usize = bufs.iter().map(|b| b.len()).sum();
        // Bounded: every pass writes something, or returns.
        while left > 0 {
            match try_writev(stream, bufs) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    left -= n;
                    IoSlice::advance_slices(bufs, n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Whether the client, while it waits for a response, closed the connection or sent more.
    pub fn poll_stir(&self, cx: &mut Context<'_>) -> Poll<Stir> {
        if let DownstreamStream::Tls(t) = self {
            // Bytes rustls already took off the socket and decrypted are a next request, and
            // a close_notify is the client's end.
            match t.conn.try_borrow_mut().map(|mut c| c.process_new_packets()) {
                Ok(Ok(state)) if state.plaintext_bytes_to_read() > 0 => {
                    return Poll::Ready(Stir::Sent);
                }
                Ok(Ok(state)) if state.peer_has_closed() => return Poll::Ready(Stir::Gone),
                Ok(Ok(_)) => {}
                Ok(Err(_)) | Err(_) => return Poll::Ready(Stir::Gone),
            }
        }
        let stream = self.tcp();
        // Bounded: a pass that does not return has cleared the readiness, and the next poll of
        // readiness is Pending unless new bytes came.
        for _ in 0..4 {
            match stream.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => return Poll::Ready(Stir::Gone),
                Poll::Ready(Ok(())) => {}
            }
            let mut probe = [MaybeUninit::<u8>::uninit(); 1];
            match stream.try_io(Interest::READABLE, || {
                SockRef::from(stream).peek(&mut probe)
            }) {
                Ok(0) => return Poll::Ready(Stir::Gone),
                // Over TLS these may be a close_notify rather than a request: the client is
                // then taken to be still there, which only delays noticing it left.
                Ok(_) => return Poll::Ready(Stir::Sent),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return Poll::Ready(Stir::Gone),
            }
        }
        Poll::Pending
    }

    /// Tells a TLS client that nothing more comes (close_notify), if the socket has room for
    /// it now: the connection closes next anyway.
    pub fn notify_close(&self) {
        if let DownstreamStream::Tls(t) = self {
            if let Ok(mut conn) = t.conn.try_borrow_mut() {
                conn.send_close_notify();
                let _ = try_flush(&t.tcp, &mut conn);
            }
        }
    }
}

/// Writes what rustls has to send (records, alerts) without waiting: `Ok(true)` once all is
/// out, `Ok(false)` when the socket is full.
fn try_flush(tcp: &TcpStream, conn: &mut ServerConnection) -> io::Result<bool> {
    // Bounded: every pass writes something, or returns.
    while conn.wants_write() {
        let sock = SockRef::from(tcp);
        match tcp.try_io(Interest::WRITABLE, || conn.write_tls(&mut &*sock)) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads from the socket with `read` (rustls's `read_tls`), waiting until there is something.
async fn read_tls(
    tcp: &TcpStream,
    mut read: impl FnMut(&mut dyn io::Read) -> io::Result<usize>,
) -> io::Result<usize> {
    // Bounded: every pass waits for readiness, and a pass that finds none clears it.
    loop {
        tcp.readable().await?;
        let sock = SockRef::from(tcp);
        match tcp.try_io(Interest::READABLE, || read(&mut &*sock)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r,
        }
    }
}

impl TlsStream {
    fn poll_read_buf(&self, buf: &mut BytesMut, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.poll_plaintext(cx, |reader, ready| {
            let start = buf.len();
            let n = ready.min(buf.capacity() - start);
            buf.resize(start + n, 0);
            let got = io::Read::read(reader, &mut buf[start..]);
            buf.truncate(start + *got.as_ref().unwrap_or(&0));
            got
        })
    }

    /// Waits until rustls has plaintext (then `take` reads it from rustls's reader, given how
    /// much there is) or the client's end (`Ok(0)`).
    fn poll_plaintext(
        &self,
        cx: &mut Context<'_>,
        take: impl FnOnce(&mut rustls::Reader<'_>, usize) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        let Ok(mut conn) = self.conn.try_borrow_mut() else {
            return Poll::Ready(Err(busy()));
        };
        let mut eof = false;
        // Bounded: every pass returns, or reads from the socket, or finds it empty and waits.
        loop {
            let state = match conn.process_new_packets() {
                Ok(state) => state,
                Err(e) => {
                    // The alert rustls queued, if there is room for it.
                    let _ = try_flush(&self.tcp, &mut conn);
                    return Poll::Ready(Err(tls_failed(e)));
                }
            };
            let ready = state.plaintext_bytes_to_read();
            if ready > 0 {
                return Poll::Ready(take(&mut conn.reader(), ready));
            }
            // A close_notify, or the socket's end without one: a request is never delimited by
            // the close, so a cut-off one shows as incomplete either way.
            if state.peer_has_closed() || eof {
                return Poll::Ready(Ok(0));
            }
            // What reading produced to send (a key update's answer) goes now if there is room,
            // else with the next response.
            if let Err(e) = try_flush(&self.tcp, &mut conn) {
                return Poll::Ready(Err(e));
            }
            ready!(self.tcp.poll_read_ready(cx))?;
            let sock = SockRef::from(&self.tcp);
            match self
                .tcp
                .try_io(Interest::READABLE, || conn.read_tls(&mut &*sock))
            {
                Ok(0) => eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Encrypts all of `bufs` into rustls's outgoing records (its buffer has no limit once
    /// the handshake is done).
    fn encrypt(&self, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        let mut conn = self.conn.try_borrow_mut().map_err(|_| busy())?;
        let mut left: usize = bufs.iter().map(|b| b.len()).sum();
        // Bounded: rustls takes something each pass, or says 0 and this fails.
        while left > 0 {
            let n = conn.writer().write_vectored(bufs)?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            left -= n;
            IoSlice::advance_slices(&mut bufs, n);
        }
        Ok(())
    }

    /// Sends what rustls has without waiting: `Ok(true)` once all is out.
    fn try_flush(&self) -> io::Result<bool> {
        let mut conn = self.conn.try_borrow_mut().map_err(|_| busy())?;
        try_flush(&self.tcp, &mut conn)
    }
}

/// A client connection as a byte stream (`AsyncRead` + `AsyncWrite`): reads and writes go to
/// the socket, through rustls on a TLS connection. For a tunnel after `101 Switching
/// Protocols`, through the shared reference the connection holds, as its other operations are;
/// for an HTTP/2 connection, which hyper's server owns, with the stream itself.
pub(crate) struct StreamIo<S>(pub S);

impl<S: Borrow<DownstreamStream> + Unpin> AsyncRead for StreamIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = match self.0.borrow() {
            DownstreamStream::Plain(tcp) => {
                // Bounded: a read that would block clears the readiness, and the next wait for
                // it is Pending unless bytes came.
                loop {
                    ready!(tcp.poll_read_ready(cx))?;
                    match tcp.try_read(out.initialize_unfilled()) {
                        Ok(n) => break n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
            }
            DownstreamStream::Tls(t) => {
                let dst = out.initialize_unfilled();
                ready!(t.poll_plaintext(cx, |reader, ready| {
                    let n = ready.min(dst.len());
                    io::Read::read(reader, &mut dst[..n])
                }))?
            }
        };
        out.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: Borrow<DownstreamStream> + Unpin> AsyncWrite for StreamIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.0.borrow() {
            DownstreamStream::Plain(tcp) => {
                // Bounded as `poll_read`.
                loop {
                    ready!(tcp.poll_write_ready(cx))?;
                    match tcp.try_write(data) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        written => return Poll::Ready(written),
                    }
                }
            }
            DownstreamStream::Tls(t) => {
                // Records still waiting for room go first, so rustls holds at most one
                // buffer's worth of this direction.
                ready!(t.poll_flush(cx))?;
                let mut conn = t.conn.try_borrow_mut().map_err(|_| busy())?;
                let n = conn.writer().write(data)?;
                try_flush(&t.tcp, &mut conn)?;
                Poll::Ready(Ok(n))
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.0.borrow() {
            DownstreamStream::Plain(_) => Poll::Ready(Ok(())),
            DownstreamStream::Tls(t) => t.poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let DownstreamStream::Tls(t) = self.0.borrow() {
            if let Ok(mut conn) = t.conn.try_borrow_mut() {
                conn.send_close_notify();
            }
            ready!(t.poll_flush(cx))?;
        }
        Poll::Ready(SockRef::from(self.0.borrow().tcp()).shutdown(std::net::Shutdown::Write))
    }
}

impl TlsStream {
    /// Sends what rustls has, waiting for room in the socket.
    fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Bounded: every pass sends something, or waits for room.
        loop {
            if self.try_flush()? {
                return Poll::Ready(Ok(()));
            }
            ready!(self.tcp.poll_write_ready(cx))?;
        }
    }
}

/// A fatal `unexpected_message` alert (RFC 8446 §6: level 2, description 10) in a plaintext
/// record: content type alert (21), legacy version 0x0303, length 2.
const UNEXPECTED_MESSAGE: [u8; 7] = [21, 3, 3, 0, 2, 2, 10];

/// Tells the client why its first flight was refused, before the caller closes the connection:
/// the alert rustls queued (a decode_error for a record that is not TLS, for one), written once
/// without waiting, as the connection closes next anyway.
///
/// A first message of the wrong type (a handshake message other than ClientHello, or a record
/// that is not a handshake) is one RFC 8446 §6.2 answers with `unexpected_message`, as nginx and
/// HAProxy do; rustls's `Acceptor` returns that error with no alert queued (its connection
/// state machine, which would send it, never ran), so the record is written here.
fn refuse_first_message(
    tcp: &TcpStream,
    e: &rustls::Error,
    mut alert: rustls::server::AcceptedAlert,
) {
    let mut queued = Vec::new();
    let _ = alert.write_all(&mut queued);
    let wrong_type = matches!(
        e,
        rustls::Error::InappropriateHandshakeMessage { .. }
            | rustls::Error::InappropriateMessage { .. }
    );
    if queued.is_empty() && wrong_type {
        queued.extend_from_slice(&UNEXPECTED_MESSAGE);
    }
    let _ = (&*SockRef::from(tcp)).write(&queued);
}

/// Why a connection to a TLS listener was not served over TLS.
pub(crate) enum Refused {
    /// It began with plain HTTP: the caller answers it, in plain HTTP, with a 400.
    PlainHttp(TcpStream),
    /// The handshake failed; why, for the metrics and the log.
    Failed(TlsFailure, String),
    /// The client's certificate was missing or did not verify (`client_ca`); why, for the log.
    ClientCert(String),
}

/// A TLS listener's handshake, as `/metrics` counts it on the listener's `stats`: one done
/// (and whether it resumed a session), or why it was not (a client certificate refused is a
/// refusal too). `shaken` is [`handshake`]'s outcome within the caller's time bound.
pub(crate) fn count_handshake(
    stats: Option<&ListenerStats>,
    shaken: &Result<Result<DownstreamStream, Refused>, tokio::time::error::Elapsed>,
) {
    let Some(s) = stats else {
        return;
    };
    let failed = match shaken {
        Ok(Ok(stream)) => {
            if stream.is_tls() {
                s.tls_handshakes.fetch_add(1, Ordering::Relaxed);
                if stream.is_resumed() {
                    s.tls_resumed.fetch_add(1, Ordering::Relaxed);
                }
            }
            return;
        }
        Ok(Err(Refused::PlainHttp(_))) => TlsFailure::PlainHttp,
        Ok(Err(Refused::ClientCert(_))) => {
            s.refuse(Refusal::ClientCert);
            TlsFailure::ClientCert
        }
        Ok(Err(Refused::Failed(failure, _))) => *failure,
        Err(_) => TlsFailure::Timeout,
    };
    s.tls_failures[failed as usize].fetch_add(1, Ordering::Relaxed);
}

/// The server side of a TLS handshake on a just-accepted connection. The caller bounds it in
/// time (`limits.header_timeout`).
pub(crate) async fn handshake(
    tcp: TcpStream,
    tls: &Terminator,
) -> Result<DownstreamStream, Refused> {
    let closed = || {
        Refused::Failed(
            TlsFailure::Closed,
            "the client closed the connection".into(),
        )
    };
    let io = |e: io::Error| Refused::Failed(TlsFailure::Closed, e.to_string());
    let invalid = |e: rustls::Error| Refused::Failed(TlsFailure::Invalid, e.to_string());
    // A TLS connection begins with a handshake record (22); plain HTTP with a method's capital
    // letter, which gets an answer it can read instead of a TLS alert.
    let mut first = [MaybeUninit::<u8>::uninit(); 1];
    let peeked = read_tls(&tcp, |_| SockRef::from(&tcp).peek(&mut first))
        .await
        .map_err(io)?;
    if peeked == 0 {
        return Err(closed());
    }
    // SAFETY: `peek` returned 1, so it initialised the byte.
    if unsafe { first[0].assume_init() }.is_ascii_uppercase() {
        return Err(Refused::PlainHttp(tcp));
    }

    let mut acceptor = Acceptor::default();
    // Bounded by the client hello's size, which rustls limits.
    let accepted = loop {
        if read_tls(&tcp, |rd| acceptor.read_tls(rd))
            .await
            .map_err(io)?
            == 0
        {
            return Err(closed());
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => break accepted,
            Ok(None) => {}
            Err((e, alert)) => {
                refuse_first_message(&tcp, &e, alert);
                return Err(invalid(e));
            }
        }
    };
    let hello = accepted.client_hello();
    if !tls
        .certificates
        .has(hello.server_name(), hello.signature_schemes())
    {
        return Err(Refused::Failed(
            TlsFailure::UnknownName,
            format!(
                "no certificate for the name {:?}, and no default certificate",
                hello.server_name().unwrap_or_default()
            ),
        ));
    }
    let mut conn = match accepted.into_connection(tls.config.clone()) {
        Ok(conn) => conn,
        Err((e, mut alert)) => {
            let _ = alert.write(&mut &*SockRef::from(&tcp));
            return Err(invalid(e));
        }
    };
    // Bounded by the handshake's few flights, and the caller's time limit.
    while conn.is_handshaking() {
        // Bounded: every pass writes something or waits for room.
        while !try_flush(&tcp, &mut conn).map_err(io)? {
            tcp.writable().await.map_err(io)?;
        }
        if !conn.is_handshaking() {
            break;
        }
        if read_tls(&tcp, |rd| conn.read_tls(rd)).await.map_err(io)? == 0 {
            return Err(closed());
        }
        if let Err(e) = conn.process_new_packets() {
            let _ = try_flush(&tcp, &mut conn);
            if tls.client_auth.is_some()
                && let Some(why) = crate::tls::client_auth::refusal(&e)
            {
                return Err(Refused::ClientCert(why));
            }
            return Err(invalid(e));
        }
    }
    // The session tickets, sent right after the handshake.
    while !try_flush(&tcp, &mut conn).map_err(io)? {
        tcp.writable().await.map_err(io)?;
    }
    // Responses are encrypted as they are written and sent at once: no limit needed.
    conn.set_buffer_limit(None);
    let client = tls.client_auth.as_ref().map(|_| {
        Arc::new(match conn.peer_certificates().and_then(|c| c.first()) {
            Some(der) => ClientIdentity::of(der),
            None => ClientIdentity::none(),
        })
    });
    Ok(DownstreamStream::Tls(Box::new(TlsStream {
        tcp,
        conn: RefCell::new(conn),
        client,
    })))
}
