//! The client's request body on its way to a backend: streamed as it arrives, kept (up to
//! `retry.buffer`) so that a failed attempt can send it again, and watched against the
//! backend's answer, which may come before the body is whole.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Method;

use crate::config::Limits;
use crate::http1::client::{self, Conn, UpstreamError};
use crate::http1::request::ClientError;
use crate::proxy::downstream::DownstreamBody;

/// The client's request body, streamed to the backend as it arrives. Up to `limit` bytes of it
/// are kept (`Bytes` are reference-counted: keeping a chunk copies nothing) so that a failed
/// attempt can send it again.
pub(crate) struct RequestBody<'b, B> {
    client: &'b mut B,
    kept: Vec<Bytes>,
    kept_len: usize,
    limit: usize,
    /// Part of the body was sent and not kept: it can no longer be sent again.
    lost: bool,
    /// Bytes read from the client so far.
    received: u64,
    /// `limits.max_body`; 0 = unlimited.
    max: u64,
    /// `limits.body_timeout`: the longest wait for the next piece of the body.
    timeout: Duration,
    /// Which of `kept` the current attempt has still to send again.
    replaying: std::ops::Range<usize>,
}

impl<'b, B: DownstreamBody> RequestBody<'b, B> {
    pub(crate) fn new(client: &'b mut B, limit: usize, limits: &Limits) -> Self {
        RequestBody {
            client,
            kept: Vec::new(),
            kept_len: 0,
            limit,
            lost: false,
            received: 0,
            max: limits.max_body,
            timeout: limits.body_timeout,
            replaying: 0..0,
        }
    }

    /// True for a request without a body.
    pub(crate) fn is_empty(&self) -> bool {
        self.kept.is_empty() && !self.lost && self.client.is_done()
    }

    /// Whether everything sent so far can be sent again.
    pub(crate) fn replayable(&self) -> bool {
        !self.lost
    }

    /// The next piece to send: what was kept from an earlier attempt first, then the rest as
    /// the client sends it, each wait for the client bounded by `limits.body_timeout`. While the
    /// client keeps the body waiting, `answer` is polled: a backend's final response that comes
    /// before the whole body was sent is returned instead, since a backend that answered may
    /// never read the rest.
    async fn next_piece<T>(
        &mut self,
        mut answer: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Result<Piece<T>, ClientError> {
        if let Some(i) = self.replaying.next() {
            if let Some(data) = self.kept.get(i) {
                return Ok(Piece::Data(data.clone()));
            }
        }
        // Only a client that sends nothing for the whole timeout is cut off: a slow but
        // steady upload goes on (nginx's client_body_timeout).
        let timeout = self.timeout;
        let next = {
            let mut piece = std::pin::pin!(tokio::time::timeout(timeout, self.client.next()));
            // The client's piece first: the backend is looked at only while the client
            // keeps the body waiting.
            std::future::poll_fn(|cx| match piece.as_mut().poll(cx) {
                Poll::Ready(piece) => Poll::Ready(Ok(piece)),
                Poll::Pending => answer(cx).map(Err),
            })
            .await
        };
        let piece = match next {
            Ok(piece) => piece,
            Err(answered) => return Ok(Piece::Answer(answered)),
        };
        let Some(data) = piece.map_err(|_| ClientError::BodyTimeout { after: timeout })?? else {
            return Ok(Piece::End);
        };
        // A Content-Length over the limit was refused up front; this catches chunked
        // bodies, before the byte over the limit goes anywhere.
        self.received += data.len() as u64;
        if self.max > 0 && self.received > self.max {
            return Err(ClientError::BodyTooLarge { limit: self.max });
        }
        if !self.lost && self.kept_len + data.len() <= self.limit {
            self.kept_len += data.len();
            self.kept.push(data.clone());
        } else if !self.lost {
            self.lost = true;
            self.kept = Vec::new();
        }
        Ok(Piece::Data(data))
    }

    /// Sends the body on an HTTP/1.1 connection, each wait for room at the backend bounded by
    /// `send_timeout`. Returns the backend's final response head when it comes before the whole
    /// body was sent; the rest is then left unsent (and unread).
    pub(crate) async fn send(
        &mut self,
        conn: &mut Conn,
        chunked: bool,
        method: &Method,
        send_timeout: Duration,
    ) -> Result<Option<client::Head>, UpstreamError> {
        self.replaying = 0..self.kept.len();
        // Bounded by the body: every pass sends a piece of it, or returns.
        loop {
            let piece = self
                .next_piece(|cx| conn.poll_response_head(cx, method))
                .await
                .map_err(UpstreamError::Client)?;
            let data = match piece {
                Piece::Data(data) => data,
                Piece::End => break,
                Piece::Answer(head) => return head.map(Some),
            };
            if let Some(head) = conn
                .write_body(&data, chunked, send_timeout, method)
                .await?
            {
                return Ok(Some(head));
            }
        }
        if chunked {
            return conn.finish_chunked(send_timeout, method).await;
        }
        Ok(None)
    }

    /// Sends the body on an HTTP/2 stream, as [`RequestBody::send`] does on a connection, with
    /// the client's trailers at its end. `response` is the stream's response, watched while the
    /// body goes; one that comes first is returned.
    pub(crate) async fn send_h2<R: Future>(
        &mut self,
        feed: &crate::upstream::h2::Feed,
        mut response: Pin<&mut R>,
        send_timeout: Duration,
    ) -> Result<Option<R::Output>, UpstreamError> {
        self.replaying = 0..self.kept.len();
        let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
        // Bounded by the body: every pass sends a piece of it, or returns.
        loop {
            let piece = self
                .next_piece(|cx| response.as_mut().poll(cx))
                .await
                .map_err(UpstreamError::Client)?;
            let data = match piece {
                Piece::Data(data) => data,
                Piece::End => {
                    feed.end(self.client.take_trailers());
                    return Ok(None);
                }
                Piece::Answer(answered) => return Ok(Some(answered)),
            };
            // Room comes when hyper took the last piece, which flow control allows; a backend
            // that takes none for `send_timeout` fails the request.
            let mut armed = false;
            let room = std::future::poll_fn(|cx| {
                if let Poll::Ready(room) = feed.poll_room(cx) {
                    return Poll::Ready(Ok(room));
                }
                if let Poll::Ready(answered) = response.as_mut().poll(cx) {
                    return Poll::Ready(Err(Some(answered)));
                }
                if !armed {
                    armed = true;
                    let at = tokio::time::Instant::now() + send_timeout;
                    match timer.as_mut() {
                        Some(t) => t.as_mut().reset(at),
                        None => timer = Some(Box::pin(tokio::time::sleep_until(at))),
                    }
                }
                match timer.as_mut().map(|t| t.as_mut().poll(cx)) {
                    Some(Poll::Ready(())) => Poll::Ready(Err(None)),
                    _ => Poll::Pending,
                }
            })
            .await;
            match room {
                Ok(Ok(())) => feed.send(data),
                // hyper stopped reading the body: the stream is over, and its response says why.
                Ok(Err(crate::upstream::h2::Abandoned)) => {
                    return Ok(Some(response.as_mut().await));
                }
                Err(Some(answered)) => return Ok(Some(answered)),
                Err(None) => return Err(UpstreamError::SendTimeout),
            }
        }
    }
}

/// What [`RequestBody::next_piece`] found.
enum Piece<T> {
    Data(Bytes),
    End,
    /// The backend answered first.
    Answer(T),
}

impl<B: DownstreamBody> RequestBody<'_, B> {
    /// Reads a body of unknown length whole, up to `bound` bytes, so that its length can go
    /// ahead of it (a FastCGI application needs CONTENT_LENGTH); it is kept, and
    /// [`RequestBody::send_fastcgi`] sends it from memory. Over `bound` is the client's 413.
    #[cold]
    pub(crate) async fn read_whole(&mut self, bound: u64) -> Result<u64, ClientError> {
        self.limit = self.limit.max(usize::try_from(bound).unwrap_or(usize::MAX));
        // Bounded by the body and `bound`: every pass keeps a piece of it, or ends.
        loop {
            match self.next_piece(|_| Poll::<()>::Pending).await? {
                Piece::Data(_) if self.lost || self.received > bound => {
                    return Err(ClientError::BodyTooLarge { limit: bound });
                }
                Piece::Data(_) | Piece::Answer(()) => {}
                Piece::End => return Ok(self.kept_len as u64),
            }
        }
    }

    /// Sends the body as FastCGI STDIN records of request `id`, then the empty record that
    /// ends the stream, each wait for room at the backend bounded by `send_timeout`. A
    /// FastCGI application answers only once it has read its STDIN, so nothing is watched for.
    #[inline(never)]
    pub(crate) async fn send_fastcgi(
        &mut self,
        conn: &mut Conn,
        id: u16,
        send_timeout: Duration,
    ) -> Result<(), UpstreamError> {
        use crate::fastcgi::record::{MAX_CONTENT, STDIN, header};
        self.replaying = 0..self.kept.len();
        // Bounded by the body: every pass sends a piece of it, or returns.
        loop {
            let piece = self
                .next_piece(|_| Poll::<()>::Pending)
                .await
                .map_err(UpstreamError::Client)?;
            let data = match piece {
                Piece::Data(data) => data,
                Piece::End | Piece::Answer(()) => break,
            };
            for part in data.chunks(MAX_CONTENT) {
                let h = header(STDIN, id, part.len());
                let mut out = [std::io::IoSlice::new(&h), std::io::IoSlice::new(part)];
                conn.write_all_within(&mut out, send_timeout).await?;
            }
        }
        let end = header(STDIN, id, 0);
        conn.write_all_within(&mut [std::io::IoSlice::new(&end)], send_timeout)
            .await
    }
}
