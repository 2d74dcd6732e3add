//! `compress`: a response's body compressed on its way to the client, as nginx's `gzip on`
//! (`gzip_types`, `gzip_min_length`, `gzip_comp_level`), with brotli and zstd beside gzip.
//!
//! On a listener or a route; a route's `compress` replaces the listener's (`false`: off; a
//! table of its own takes the keys it leaves out from the listener's). Only what the proxy
//! answers for a backend is compressed (a backend's response, or pinlb's 502/503/504 in its
//! place), not a route's own `respond` or `redirect`, nor a HEAD's. The response gets `Vary:
//! Accept-Encoding` whenever it could have been compressed, and loses its Content-Length when
//! it is; the client's coding is the one its `Accept-Encoding` takes at the highest q-value.
//!
//! - [`config`]: the keys, their validated type and its defaults.
//! - [`deflate`]: gzip's encoder, zlib's deflate sized to the response and reused.
//! - [`encoder`]: the client's coding, which responses, their header edits, the encoders.

mod config;
mod deflate;
mod encoder;

use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Version};
use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::{BodyFilter, Module, Place, Response};
use crate::syntax::error::ConfigError;
use config::{Coding, Compress};
pub use config::{RawCompress, RawCompressTable};
use encoder::{Encoder, Facts, OUT_CHUNK};

/// The module.
pub(crate) enum Compression {}

/// Its key as the file writes it: `true`, `false` or a table.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    pub compress: Option<Spanned<RawCompress>>,
}

impl Module for Compression {
    const KEYS: &'static [&'static str] = &["compress"];
    type Raw = Raw;
    type Config = Compress;
    type Local = ();
    type Filter = Compressor;
    const BODY: bool = true;

    fn validate(
        at: &Place<'_>,
        raw: &Raw,
        inherited: Option<&Arc<Compress>>,
    ) -> Result<Option<Arc<Compress>>, ConfigError> {
        config::validate(at.src, at.key, raw.compress.as_ref(), inherited)
    }

    fn filter(c: &Arc<Compress>, response: &mut Response<'_>) -> Option<Compressor> {
        let request = response.request.head;
        if !response.proxied || request.method == Method::HEAD {
            return None;
        }
        let headers = &mut *response.headers;
        let facts = Facts::of(headers);
        if !encoder::eligible(c, response.status, headers, &facts, response.length) {
            return None;
        }
        encoder::add_vary(headers, &facts);
        // nginx's `gzip_http_version 1.1`: an HTTP/1.0 client (or a cache in front of one)
        // gets the response as it is.
        if request.version == Version::HTTP_10 {
            return None;
        }
        let accept = request.header_values("accept-encoding");
        let coding = encoder::negotiate(accept, &c.algorithms)?;
        let encoder = match Encoder::new(coding, c, response.length) {
            Ok(e) => e,
            Err(e) => {
                crate::sys::summed::summed_warn!(
                    "response sent uncompressed: {} encoder: {e}",
                    coding.token()
                );
                return None;
            }
        };
        encoder::edit_headers(headers, coding);
        Some(Compressor {
            encoder,
            unflushed: false,
            ready: false,
            end: None,
        })
    }

    /// `compress: gzip level 6, types text/html, text/css, from 20 bytes`.
    fn describe(c: &Compress) -> String {
        let algorithms: Vec<String> = (c.algorithms.iter())
            .map(|a| match a {
                Coding::Gzip => format!("gzip level {}", c.gzip_level),
                Coding::Brotli => format!("br level {}", c.br_level),
                Coding::Zstd => format!("zstd level {}", c.zstd_level),
            })
            .collect();
        format!(
            "compress: {}, types {}, from {} bytes",
            algorithms.join(", "),
            c.types.join(", "),
            c.min_length
        )
    }
}

/// One response's compression: the body's pieces go into the encoder as they come; its output
/// goes out once it holds [`OUT_CHUNK`], and is flushed whenever the body has nothing more for
/// now, so a streamed response (server-sent events, a slow page) reaches the client as the
/// backend sends it.
pub(crate) struct Compressor {
    encoder: Encoder,
    /// Input taken in since the last flush.
    unflushed: bool,
    /// The encoder's output is to go out now.
    ready: bool,
    /// The rest of the output with the coding's trailer, once the body ended.
    end: Option<Bytes>,
}

/// An encoder's error as the response's: the body breaks off.
fn broke(e: io::Error) -> io::Error {
    io::Error::other(format!("compressing the response: {e}"))
}

impl BodyFilter for Compressor {
    fn push(&mut self, piece: Option<Bytes>) -> io::Result<()> {
        match piece {
            Some(piece) => {
                self.encoder.write(&piece).map_err(broke)?;
                self.unflushed = true;
                self.ready = self.encoder.buffered() >= OUT_CHUNK;
            }
            None => {
                self.ready = false;
                self.end = Some(self.encoder.finish().map_err(broke)?);
            }
        }
        Ok(())
    }

    fn idle(&mut self) -> io::Result<()> {
        if self.unflushed {
            // The backend has nothing more for now: what it sent goes out whole.
            self.unflushed = false;
            self.encoder.flush().map_err(broke)?;
            self.ready = true;
        }
        Ok(())
    }

    fn poll_out(&mut self, _: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let out = match self.end.take() {
            Some(end) => end,
            None if self.ready => {
                self.ready = false;
                self.encoder.take()
            }
            None => return Poll::Ready(None),
        };
        Poll::Ready((!out.is_empty()).then_some(out))
    }

    fn is_empty(&self) -> bool {
        !self.ready && self.end.is_none()
    }

    fn keeps_length(&self) -> bool {
        false
    }
}
