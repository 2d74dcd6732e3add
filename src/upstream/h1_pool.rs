//! The HTTP/1.1 pool: one worker's idle keep-alive connections to one backend.

use std::cell::RefCell;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::Poll;

use crate::http1::client::Conn;

/// Idle connections to one backend, most recently used on top, so the warmest connection is
/// reused and surplus ones age out. Shared (`Rc`) with the next configuration generation's
/// worker view when it keeps the backend.
#[derive(Clone, Default)]
pub(super) struct Idle(Rc<RefCell<Vec<Conn>>>);

impl Idle {
    /// Takes an idle connection that is still open, dropping ones the backend closed. Most
    /// recently used first: it is the least likely to have been closed.
    pub(super) async fn checkout(&self) -> Option<Conn> {
        poll_fn(|cx| {
            let mut idle = self.0.borrow_mut();
            while let Some(mut conn) = idle.pop() {
                if conn.is_usable_idle(cx) {
                    conn.reused = true;
                    return Poll::Ready(Some(conn));
                }
            }
            Poll::Ready(None)
        })
        .await
    }

    /// Keeps a connection after a complete exchange; beyond `keepalive` it is closed instead.
    pub(super) fn checkin(&self, conn: Conn, keepalive: usize) {
        let mut idle = self.0.borrow_mut();
        if idle.len() < keepalive {
            idle.push(conn);
        }
    }
}
