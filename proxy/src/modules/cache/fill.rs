//! [`Fill`]: the filter that keeps a copy of a response's body as it goes to the client, and
//! stores the response whole once its body ended.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::StatusCode;

use super::stored::{Entry, Stored};
use super::zone::{Lead, Zone};

/// A response on its way to be stored: its head, taken when it came, and where it goes.
pub(crate) struct Pending {
    pub zone: Arc<Zone>,
    pub key: Vec<u8>,
    pub status: StatusCode,
    pub lines: Vec<u8>,
    pub age: Duration,
    pub fresh_for: Duration,
    pub vary: Vec<String>,
    pub while_revalidating: Duration,
    pub if_error: Duration,
    pub stale_forbidden: bool,
    /// The request headers' values its variant is kept by, as [`variant_key`] writes them.
    pub variant: Option<Vec<u8>>,
    /// This request's hold on the key, when it leads the misses: let go once it is stored
    /// (or not), which wakes the requests that wait.
    pub lead: Option<Lead>,
}

/// The body filter that keeps a copy of the body, up to the zone's `max_object`, and stores
/// the response once the body ended whole. A body cut short (the backend or the client gone)
/// is not stored; the requests waiting for it are woken all the same.
pub(crate) struct Fill {
    pending: Option<Pending>,
    kept: BytesMut,
    /// The piece to let out.
    held: Option<Bytes>,
}

impl Fill {
    pub(crate) fn new(pending: Pending) -> Fill {
        Fill {
            pending: Some(pending),
            kept: BytesMut::new(),
            held: None,
        }
    }

    /// Takes the body's next piece (`None`: it ended): kept, and held to go out.
    pub(crate) fn take(&mut self, piece: Option<Bytes>) {
        match piece {
            Some(p) => {
                if let Some(pending) = &self.pending {
                    if (self.kept.len() + p.len()) as u64 > pending.zone.max_object {
                        // Too large to store: the waiting requests go on to the backend now.
                        self.pending = None;
                        self.kept = BytesMut::new();
                    } else {
                        self.kept.extend_from_slice(&p);
                    }
                }
                self.held = Some(p);
            }
            None => {
                if let Some(p) = self.pending.take() {
                    store(p, std::mem::take(&mut self.kept).freeze());
                }
            }
        }
    }

    /// The piece held to go out, if any.
    pub(crate) fn out(&mut self) -> Option<Bytes> {
        self.held.take()
    }

    pub(crate) fn holds_nothing(&self) -> bool {
        self.held.is_none()
    }
}

/// `p` with its whole `body`, into its zone; its lead let go.
pub(crate) fn store(p: Pending, body: Bytes) -> Arc<Entry> {
    let fields = crate::http1::common::header_map(&p.lines);
    let etag = fields.get(http::header::ETAG).map(|v| v.as_bytes().to_vec());
    let last_modified = (fields.get(http::header::LAST_MODIFIED))
        .and_then(|v| httpdate::parse_http_date(v.to_str().ok()?).ok());
    let stored = Stored {
        status: p.status,
        lines: p.lines,
        body,
        stored_at: Instant::now(),
        age: p.age,
        fresh_for: p.fresh_for,
        etag,
        last_modified,
        while_revalidating: p.while_revalidating,
        if_error: p.if_error,
        stale_forbidden: p.stale_forbidden,
    };
    let entry = Arc::new(Entry::Response(stored));
    match p.variant {
        Some(variant) => {
            p.zone.insert(p.key, Arc::new(Entry::Vary(p.vary.into_boxed_slice())));
            p.zone.insert(variant, entry.clone());
        }
        None => p.zone.insert(p.key, entry.clone()),
    }
    drop(p.lead);
    entry
}
