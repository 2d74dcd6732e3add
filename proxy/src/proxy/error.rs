//! Why a request got no backend's answer, and the one status each cause maps to.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::backend_address::BackendAddress;
use crate::http1::common::{ERROR_PAGE_TYPE, Reply, error_page};
use crate::http1::request::ClientError;
use crate::proxy::body::{ProxyBody, local_reply};
use crate::upstream::queue::Refused;

/// Why a request could not be answered by a backend. Each kind maps to one status, in
/// [`ProxyError::status`]; a client's fault keeps [`ClientError::status`].
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// No backend could be picked: each is down, skipped after failures, or at `max_conns`. The
    /// text says which.
    #[error("{0}")]
    NoBackend(String),
    /// Every backend was tried and failed to connect, or the chosen one failed mid-exchange.
    #[error("backend {backend} failed: {cause}")]
    BadGateway {
        backend: BackendAddress,
        cause: String,
    },
    /// The backend did not send response headers within `timeouts.response`.
    #[error("backend {backend} sent no response headers within {after:?}")]
    Timeout {
        backend: BackendAddress,
        after: Duration,
    },
    /// The backend took no more of the request for `timeouts.send`.
    #[error("backend {backend} took no more of the request for {after:?}")]
    SendTimeout {
        backend: BackendAddress,
        after: Duration,
    },
    /// Every backend was at `max_conns` and the upstream's queue was full, or the request
    /// waited `timeouts.queue` in it.
    #[error("{}", queue_refusal(.0))]
    Queue(Refused),
    /// The client's request was refused, or its body failed, before any backend answered.
    #[error("{0}")]
    Downstream(ClientError),
    /// A body could not be buffered: its temporary file failed (`[upstream.NAME.buffering]`).
    #[error("buffering the body failed: {0}")]
    Buffering(String),
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoBackend(_) | ProxyError::Queue(_) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::BadGateway { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::Timeout { .. } | ProxyError::SendTimeout { .. } => {
                StatusCode::GATEWAY_TIMEOUT
            }
            ProxyError::Downstream(e) => e.status(),
            ProxyError::Buffering(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

fn queue_refusal(r: &Refused) -> String {
    match r {
        Refused::Full { max } => {
            format!("every backend is at max_conns and the queue is full ({max} requests waiting)")
        }
        Refused::TimedOut { after } => format!(
            "every backend stayed at max_conns while the request waited {after:?} in the queue"
        ),
    }
}

/// A short text response for a request pinlb had to answer itself. A refusal of the queue
/// says when to try again (RFC 9110 §10.2.3): in a second, when slots have freed, as they do
/// continuously under load.
pub fn error_response(e: &ProxyError, method: &Method) -> Reply<ProxyBody> {
    let status = e.status();
    let lines: &[u8] = match e {
        ProxyError::Queue(_) => b"retry-after: 1\r\n",
        _ => b"",
    };
    local_reply(
        status,
        ERROR_PAGE_TYPE,
        Bytes::from(error_page(status, e)),
        lines,
        method,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_maps_to_one_status() {
        let a: BackendAddress = "127.0.0.1:1".parse().unwrap();
        let client = |e| ProxyError::Downstream(e).status().as_u16();
        assert_eq!(client(ClientError::MissingHost), 400);
        assert_eq!(client(ClientError::DuplicateHost), 400);
        assert_eq!(client(ClientError::InvalidHost), 400);
        assert_eq!(client(ClientError::AsteriskForm), 400);
        assert_eq!(client(ClientError::TransferEncoding), 400);
        assert_eq!(client(ClientError::ContentLength("x")), 400);
        assert_eq!(client(ClientError::UriTooLong { len: 2, limit: 1 }), 414);
        assert_eq!(client(ClientError::BodyTooLarge { limit: 1 }), 413);
        assert_eq!(ProxyError::NoBackend(String::new()).status(), 503);
        assert_eq!(
            ProxyError::BadGateway {
                backend: a,
                cause: "x".into()
            }
            .status(),
            502
        );
        assert_eq!(
            ProxyError::Timeout {
                backend: a,
                after: Duration::from_secs(1)
            }
            .status(),
            504
        );
        assert_eq!(
            ProxyError::SendTimeout {
                backend: a,
                after: Duration::from_secs(1)
            }
            .status(),
            504
        );
    }
}
