//! Request and response bodies: small fixed ones, large generated ones, and counting what
//! arrives.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Empty, Full, combinators::BoxBody};
use hyper::body::Incoming;

pub type BoxError = Box<dyn StdError + Send + Sync>;
/// The body type of every request the test clients send.
pub type ClientBody = BoxBody<Bytes, BoxError>;

pub fn full(s: impl Into<Bytes>) -> ClientBody {
    Full::new(s.into())
        .map_err(|e: Infallible| match e {})
        .boxed()
}

pub fn empty() -> ClientBody {
    Empty::new().map_err(|e: Infallible| match e {}).boxed()
}

/// A body of `len` bytes produced on the fly in 64 KiB slices of one shared buffer, so even
/// hundreds of MiB never sit in memory. With `exact`, it reports its length (hyper then frames it
/// with Content-Length); without, hyper sends it chunked.
pub struct GenBody {
    remaining: u64,
    exact: bool,
    chunk: Bytes,
    /// Bytes produced so far, for tests that watch back-pressure.
    produced: Option<Arc<AtomicU64>>,
}

impl GenBody {
    pub fn new(len: u64, exact: bool) -> GenBody {
        let chunk: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
        GenBody {
            remaining: len,
            exact,
            chunk: Bytes::from(chunk),
            produced: None,
        }
    }

    /// Like [`GenBody::new`], adding every byte it produces to `produced`.
    pub fn counted(len: u64, exact: bool, produced: Arc<AtomicU64>) -> GenBody {
        GenBody {
            produced: Some(produced),
            ..GenBody::new(len, exact)
        }
    }

    pub fn boxed(self) -> ClientBody {
        BodyExt::boxed(self)
    }
}

impl Body for GenBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let n = self.remaining.min(self.chunk.len() as u64) as usize;
        self.remaining -= n as u64;
        if let Some(p) = &self.produced {
            p.fetch_add(n as u64, Ordering::SeqCst);
        }
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        if self.exact {
            SizeHint::with_exact(self.remaining)
        } else {
            SizeHint::default()
        }
    }
}

/// Reads a response body to the end, counting bytes without keeping them.
pub async fn count_body(mut body: Incoming) -> u64 {
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("body frame").into_data() {
            n += data.len() as u64;
        }
    }
    n
}
