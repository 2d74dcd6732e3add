//! A FastCGI application's response body: FCGI_STDOUT after the CGI head, streamed to the
//! client until the application's FCGI_END_REQUEST, which returns the connection to the pool;
//! FCGI_STDERR logged at the backend as it comes.

use crate::backend_address::BackendAddress;
use std::rc::Rc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;

use crate::fastcgi::record::{self, Record};
use crate::http1::client::{Conn, UpstreamError};
use crate::sys::summed::summed_warn;
use crate::upstream::in_flight::InFlight;
use crate::upstream::local::WorkerUpstream;

/// The one request ID each connection carries at a time: php-fpm does not multiplex.
pub(crate) const ID: u16 = 1;

/// An FCGI_STDERR record, one log line per line of it, at the backend.
#[cold]
pub(crate) fn log_stderr(addr: BackendAddress, text: &[u8]) {
    for line in text.split(|&b| b == b'\n') {
        let line = String::from_utf8_lossy(line.trim_ascii());
        if !line.is_empty() {
            summed_warn!(backend = %addr; "FastCGI stderr: {line}");
        }
    }
}

/// A FastCGI application's response body: FCGI_STDOUT after the CGI head, until its
/// FCGI_END_REQUEST.
pub struct FastcgiBody {
    /// `None` once the request has ended.
    pub(crate) conn: Option<Conn>,
    /// A piece of the body already read, to return next.
    pub(crate) next: Option<Bytes>,
    /// What is still to come of a body the application gave a Content-Length.
    pub(crate) remaining: Option<u64>,
    /// The response has no body (HEAD, 204, 304): what the application writes is dropped.
    pub(crate) discard: bool,
    pub(crate) has_date: bool,
    /// The in-flight count and where the connection goes back, until the request ends.
    pub(crate) held: Option<(InFlight, Rc<WorkerUpstream>, usize)>,
    pub(crate) addr: BackendAddress,
}

/// What one record of the body did.
enum Step {
    /// It was taken (a piece of the body is in `next`, or it was stderr or ignored).
    Took,
    /// The buffer holds no whole record: more must be read.
    More,
    /// The application ended the request.
    Ended,
}

impl FastcgiBody {
    pub fn remaining(&self) -> Option<u64> {
        self.remaining
    }

    pub fn has_date(&self) -> bool {
        self.has_date
    }

    /// Whether the application's FCGI_END_REQUEST is taken and no piece is left to return.
    pub fn is_end(&self) -> bool {
        self.conn.is_none() && self.next.is_none()
    }

    /// The next piece of the body; `None` once the application ended the request. Out of line:
    /// `ProxyBody::poll_data` is inlined into every HTTP/1.1 response's write.
    #[inline(never)]
    pub fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        // Bounded by what the backend sends: every pass takes a record, reads, or returns.
        loop {
            // Never an empty piece: to the client side that would end the body.
            if let Some(data) = self.next.take().filter(|d| !d.is_empty()) {
                return Poll::Ready(Some(self.deliver(data)));
            }
            let step = match self.step() {
                Ok(step) => step,
                Err(e) => return Poll::Ready(Some(Err(e))),
            };
            match step {
                Step::Took => {}
                Step::Ended => return Poll::Ready(None),
                Step::More => {
                    let Some(conn) = self.conn.as_mut() else {
                        return Poll::Ready(None);
                    };
                    match ready!(conn.poll_fill(cx)) {
                        Ok(0) => {
                            let e = self.broken("FastCGI connection closed mid-response");
                            return Poll::Ready(Some(Err(e)));
                        }
                        Ok(_) => {}
                        Err(e) => {
                            self.release(false);
                            return Poll::Ready(Some(Err(e.into())));
                        }
                    }
                }
            }
        }
    }

    /// A piece of the body on its way out, checked against the Content-Length. The records
    /// after it that are already read are taken at once: the request's end usually comes in
    /// the same read, and the connection is then back in the pool before the client has its
    /// last byte.
    fn deliver(&mut self, data: Bytes) -> Result<Bytes, UpstreamError> {
        if let Some(left) = self.remaining.as_mut() {
            if data.len() as u64 > *left {
                return Err(self.broken("FastCGI output longer than its Content-Length"));
            }
            *left -= data.len() as u64;
        }
        // Bounded by the buffer: every pass takes a record.
        while self.next.is_none() && self.conn.is_some() {
            if !matches!(self.step()?, Step::Took) {
                break;
            }
        }
        Ok(data)
    }

    /// Takes one record of the response from the connection's buffer.
    fn step(&mut self) -> Result<Step, UpstreamError> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(Step::Ended);
        };
        match record::decode(conn.read_buf(), ID) {
            Ok(Some(Record::Stdout(data))) => {
                if !data.is_empty() && !self.discard {
                    self.next = Some(data);
                }
                Ok(Step::Took)
            }
            Ok(Some(Record::Stderr(text))) => {
                log_stderr(self.addr, &text);
                Ok(Step::Took)
            }
            Ok(Some(Record::End {
                protocol_status, ..
            })) => {
                if self.remaining.is_some_and(|left| left > 0) {
                    return Err(self.broken("FastCGI output shorter than its Content-Length"));
                }
                self.release(protocol_status == 0);
                Ok(Step::Ended)
            }
            Ok(Some(Record::Other(_))) => Ok(Step::Took),
            Ok(None) => Ok(Step::More),
            Err(_) => Err(self.broken("malformed FastCGI record")),
        }
    }

    /// The body broke off: the connection is closed, and the client's response aborted.
    fn broken(&mut self, why: &'static str) -> UpstreamError {
        self.release(false);
        UpstreamError::Invalid(why)
    }

    /// Drops the in-flight count, and returns the connection to the pool after a complete
    /// request (`complete`) that left nothing unread on it; closes it otherwise.
    fn release(&mut self, complete: bool) {
        let conn = self.conn.take();
        if let Some((guard, upstream, backend)) = self.held.take() {
            drop(guard);
            if let Some(mut conn) = conn.filter(|_| complete) {
                if conn.read_buf().is_empty() {
                    upstream.checkin(backend, conn);
                }
            }
        }
    }
}

impl Drop for FastcgiBody {
    /// A body dropped before its end (a HEAD's, a 204's or 304's, which the client side never
    /// reads, or a client gone) takes what is already read of the request's records: when the
    /// application's FCGI_END_REQUEST is among them, the connection still goes back to the pool.
    /// Anything still to come closes it.
    fn drop(&mut self) {
        // Bounded by the buffer: every pass takes a record, or ends.
        while self.conn.is_some() {
            self.next = None;
            if !matches!(self.step(), Ok(Step::Took)) {
                break;
            }
        }
    }
}
