//! The thread's spare buffers for message heads, kept between requests.
//!
//! Every plain request makes two heads that live only while it does: the request's own lines
//! as they go to the backend (`http1::request::RequestHead`'s text) and the response head as it
//! goes to the client (`http1::client::Head`'s lines, the status line put in front of them).
//! Each was a fresh allocation and its free, about 100 instructions a head through the
//! allocator's aligned path (`benches/callgrind.sh`). As nginx's per-request pools and
//! HAProxy's buffer pools do, the thread keeps the buffers of heads it is done with and hands
//! them to the next heads instead.
//!
//! Bounded twice, so that what the thread keeps is what a burst of requests left, not what its
//! connections hold: at most [`KEPT`] buffers, each of at most [`KEPT_CAPACITY`] bytes (a larger
//! head's buffer goes back to the allocator). A buffer given back on another thread than the
//! one it came from is kept by that thread, or freed; both are sound, since it is a plain
//! `Vec<u8>`.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

/// Most buffers one thread keeps.
pub const KEPT: usize = 64;
/// The largest buffer kept; typical heads take a few hundred bytes.
pub const KEPT_CAPACITY: usize = 4096;

thread_local! {
    static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A head's buffer, given back to the thread when dropped.
#[derive(Debug, Default)]
pub struct Spare(Vec<u8>);

impl Spare {
    /// The buffer, no longer given back when dropped.
    #[inline]
    pub fn into_vec(mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

impl From<Vec<u8>> for Spare {
    /// A buffer that goes to the thread's spares when dropped, wherever it came from.
    #[inline]
    fn from(buf: Vec<u8>) -> Spare {
        Spare(buf)
    }
}

impl Deref for Spare {
    type Target = Vec<u8>;
    #[inline]
    fn deref(&self) -> &Vec<u8> {
        &self.0
    }
}

impl DerefMut for Spare {
    #[inline]
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }
}

impl Drop for Spare {
    #[inline]
    fn drop(&mut self) {
        give(std::mem::take(&mut self.0));
    }
}

/// An empty buffer with room for at least `len` bytes: the one this thread was last given
/// back, or a new one.
#[inline]
pub fn take(len: usize) -> Spare {
    // `try_with`, here and in `give`: a head dropped while the thread exits, after its spares
    // were freed, is freed too rather than a panic.
    let kept = SPARE
        .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.pop()))
        .ok()
        .flatten();
    Spare(match kept {
        Some(mut buf) => {
            buf.reserve(len);
            buf
        }
        None => Vec::with_capacity(len),
    })
}

/// Gives `buf` back for a later head, emptied; freed instead when it is large or the thread
/// keeps enough.
#[inline]
fn give(mut buf: Vec<u8>) {
    if buf.capacity() == 0 || buf.capacity() > KEPT_CAPACITY {
        return;
    }
    buf.clear();
    let _ = SPARE.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            if s.len() < KEPT {
                s.push(buf);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each test runs on a thread of its own, so the thread's pool starts empty.
    fn kept() -> usize {
        SPARE.with(|s| s.borrow().len())
    }

    #[test]
    fn a_buffer_dropped_is_the_next_one_taken_emptied() {
        let mut buf = take(100);
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let at = buf.as_ptr();
        drop(buf);
        let again = take(10);
        assert_eq!((again.as_ptr(), again.len()), (at, 0));
        assert!(again.capacity() >= 100);
        // A larger head than the kept buffer's room grows it.
        drop(again);
        assert!(take(1000).capacity() >= 1000);
        // One taken out as a plain Vec is not given back.
        let vec = take(10).into_vec();
        assert_eq!(kept(), 0);
        drop(Spare::from(vec));
        assert_eq!(kept(), 1);
    }

    #[test]
    fn a_buffer_dropped_after_the_threads_spares_is_freed_without_a_panic() {
        struct Holder(RefCell<Option<Spare>>);
        thread_local! {
            static HOLDER: Holder = const { Holder(RefCell::new(None)) };
        }
        impl Drop for Holder {
            fn drop(&mut self) {
                drop(self.0.take());
            }
        }
        let exited = std::thread::spawn(|| {
            // The holder's destructor is registered first, so (on Linux, which runs them in
            // reverse) it runs after the spares' and drops a buffer when they are gone.
            HOLDER.with(|h| *h.0.borrow_mut() = Some(Spare::from(vec![0u8; 16])));
            drop(take(8));
            assert_eq!(kept(), 1);
        })
        .join();
        assert!(exited.is_ok());
    }

    #[test]
    fn large_buffers_and_buffers_beyond_the_bound_are_freed() {
        drop(Spare::from(Vec::with_capacity(KEPT_CAPACITY + 1)));
        drop(Spare::default());
        assert_eq!(kept(), 0);
        for _ in 0..KEPT + 10 {
            drop(Spare::from(Vec::with_capacity(64)));
        }
        assert_eq!(kept(), KEPT);
        let taken: Vec<Spare> = (0..KEPT).map(|_| take(1)).collect();
        assert_eq!(kept(), 0);
        assert!(take(8).capacity() >= 8, "an empty pool makes a new buffer");
        drop(taken);
        assert_eq!(kept(), KEPT, "given back as they are dropped");
    }
}
