//! pinlb's own FastCGI codec, for `protocol = "fastcgi"` upstreams (php-fpm). The crates on
//! offer either own the socket (`fastcgi-client` runs the whole exchange on a stream it holds,
//! so the pool, the timers and the PROXY header would be bypassed) or serve the application's
//! side (`fastcgi`, `fcgi`); the protocol is small, so its framing is here, pure and fuzzed
//! (`fuzz/fuzz_targets/fastcgi.rs`), and the exchange runs on pinlb's pooled backend
//! connection (`proxy::fastcgi`).
//!
//! - [`record`]: the records: headers, BEGIN_REQUEST, name-value pairs, streams, decoding.
//! - [`params`]: the request as CGI variables, and which script a path names.
//! - [`response`]: the CGI response head on FCGI_STDOUT: `Status:`, `Location:`, headers.

pub mod params;
pub mod record;
pub mod response;
