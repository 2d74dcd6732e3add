//! A buffered body's bytes: in memory up to a bound, then in a temporary file up to another,
//! read back in the order they came. Request buffering fills one and reads it back whole;
//! response buffering shares one ([`Channel`]) between the task that drains the backend and the
//! client's [`SpooledBody`].
//!
//! The file is made on first need in the upstream's `temp_dir` with `tempfile::tempfile_in`,
//! which unlinks it at once (`O_TMPFILE`): it has no name, is gone when closed, and a crash
//! leaves nothing behind. It is emptied (truncated) each time the reader catches up, so it holds
//! at most what is waiting. Its reads and writes are blocking on the worker's thread, each at
//! most [`PIECE`] bytes, as nginx's workers write their temp files without aio threads: a page
//! cache write of 64 KiB costs microseconds.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};

use crate::config::Buffering;
use crate::http1::client::UpstreamError;

/// The most one file read or write moves at once.
pub(crate) const PIECE: usize = 64 * 1024;

/// A body's bytes waiting to be read: memory first, then the file. A piece goes to memory only
/// while the file holds nothing, so every byte in memory came before every byte in the file.
pub(crate) struct Spool {
    memory: VecDeque<Bytes>,
    in_memory: usize,
    memory_limit: usize,
    file: Option<File>,
    /// Where the next byte is written in the file, and where the next is read.
    written: u64,
    read: u64,
    file_limit: u64,
    /// Bytes that went to the file, in all (what the tests read).
    to_disk: u64,
}

impl Spool {
    pub(crate) fn new(b: &Buffering) -> Spool {
        Spool {
            memory: VecDeque::new(),
            in_memory: 0,
            memory_limit: b.memory,
            file: None,
            written: 0,
            read: 0,
            file_limit: b.max_temp,
            to_disk: 0,
        }
    }

    /// Bytes waiting.
    pub(crate) fn len(&self) -> u64 {
        self.in_memory as u64 + (self.written - self.read)
    }

    /// Bytes that went to the temporary file, in all.
    #[cfg(test)]
    pub(crate) fn to_disk(&self) -> u64 {
        self.to_disk
    }

    /// Whether `n` more bytes fit. An empty spool takes any piece, so that one larger than
    /// both bounds still moves.
    pub(crate) fn has_room(&self, n: usize) -> bool {
        let file_empty = self.written == self.read;
        let memory = self.in_memory == 0 || self.in_memory + n <= self.memory_limit;
        (file_empty && memory) || self.written + n as u64 <= self.file_limit
    }

    /// Keeps `data`, which [`Spool::has_room`] said fits, in memory or in the file (made in
    /// `dir` on first need).
    pub(crate) fn push(&mut self, data: Bytes, dir: &Path) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let n = data.len();
        // An empty file is always at offset 0: `pop` rewinds it when it catches up.
        let file_empty = self.written == self.read;
        let fits = self.in_memory + n <= self.memory_limit;
        // A piece that fits neither bound goes to an empty spool's memory (see `has_room`).
        let too_large = self.in_memory == 0 && n as u64 > self.file_limit;
        if file_empty && (fits || too_large) {
            self.in_memory += n;
            self.memory.push_back(data);
            return Ok(());
        }
        let file = match &mut self.file {
            Some(f) => f,
            None => self.file.insert(tempfile::tempfile_in(dir)?),
        };
        for piece in data.chunks(PIECE) {
            file.write_all_at(piece, self.written)?;
            self.written += piece.len() as u64;
        }
        self.to_disk += data.len() as u64;
        Ok(())
    }

    /// The next piece, in order; `None` when nothing is waiting.
    pub(crate) fn pop(&mut self) -> io::Result<Option<Bytes>> {
        if let Some(data) = self.memory.pop_front() {
            self.in_memory -= data.len();
            return Ok(Some(data));
        }
        let (Some(file), true) = (&self.file, self.read < self.written) else {
            return Ok(None);
        };
        let n = (self.written - self.read).min(PIECE as u64) as usize;
        let mut buf = BytesMut::zeroed(n);
        file.read_exact_at(&mut buf, self.read)?;
        self.read += n as u64;
        if self.read == self.written {
            // Caught up: the file's blocks are given back, and it is written from its start.
            file.set_len(0)?;
            self.read = 0;
            self.written = 0;
        }
        Ok(Some(buf.freeze()))
    }
}

/// A response body on its way from the task that drains the backend to the client, on one
/// worker (`Rc`, `RefCell`: no lock).
pub(crate) struct Channel {
    pub(crate) spool: Spool,
    /// The backend's body is over, whole (`error` none) or broken.
    pub(crate) done: bool,
    /// Why the backend's body broke off, for the client to see once it has read what came.
    pub(crate) error: Option<UpstreamError>,
    /// The client went away: the drain stops.
    pub(crate) gone: bool,
    /// Woken when bytes come or the body ends.
    pub(crate) reader: Option<Waker>,
    /// Woken when the reader made room or went away.
    pub(crate) drain: Option<Waker>,
}

impl Channel {
    pub(crate) fn new(b: &Buffering) -> Rc<RefCell<Channel>> {
        Rc::new(RefCell::new(Channel {
            spool: Spool::new(b),
            done: false,
            error: None,
            gone: false,
            reader: None,
            drain: None,
        }))
    }

    pub(crate) fn wake_reader(&mut self) {
        if let Some(w) = self.reader.take() {
            w.wake();
        }
    }
}

/// A buffered response's body as the client side reads it (`ProxyBody::Spooled`).
pub struct SpooledBody {
    channel: Rc<RefCell<Channel>>,
    /// The body's length still to come, when the backend framed it by length.
    remaining: Option<u64>,
    has_date: bool,
    /// The backend that answered, for a sticky upstream's cookie (`ProxyBody::answered_by`).
    answered: Option<crate::backend_address::BackendAddress>,
}

impl SpooledBody {
    pub(crate) fn new(
        channel: Rc<RefCell<Channel>>,
        remaining: Option<u64>,
        has_date: bool,
        answered: Option<crate::backend_address::BackendAddress>,
    ) -> Self {
        SpooledBody {
            channel,
            remaining,
            has_date,
            answered,
        }
    }

    pub fn answered_by(&self) -> Option<crate::backend_address::BackendAddress> {
        self.answered
    }

    pub fn remaining(&self) -> Option<u64> {
        self.remaining
    }

    pub fn has_date(&self) -> bool {
        self.has_date
    }

    /// The next piece: what the drain kept, then the end (or the backend's error) once it saw
    /// it. A temporary file that fails to read aborts the response.
    #[inline(never)]
    pub fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        let mut ch = self.channel.borrow_mut();
        match ch.spool.pop() {
            Ok(Some(data)) => {
                if let Some(w) = ch.drain.take() {
                    w.wake();
                }
                if let Some(r) = &mut self.remaining {
                    *r = r.saturating_sub(data.len() as u64);
                }
                Poll::Ready(Some(Ok(data)))
            }
            Ok(None) => {
                if let Some(e) = ch.error.take() {
                    return Poll::Ready(Some(Err(e)));
                }
                if ch.done {
                    return Poll::Ready(None);
                }
                ch.reader = Some(cx.waker().clone());
                Poll::Pending
            }
            Err(e) => {
                let e = io::Error::new(e.kind(), format!("reading the buffered response: {e}"));
                Poll::Ready(Some(Err(UpstreamError::Io(e))))
            }
        }
    }
}

impl Drop for SpooledBody {
    fn drop(&mut self) {
        let mut ch = self.channel.borrow_mut();
        ch.gone = true;
        if let Some(w) = ch.drain.take() {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(memory: usize, max_temp: u64) -> Buffering {
        Buffering {
            memory,
            max_temp,
            ..Buffering::on(std::env::temp_dir())
        }
    }

    fn drain(s: &mut Spool) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(d) = s.pop().unwrap() {
            out.extend_from_slice(&d);
        }
        out
    }

    #[test]
    fn bytes_come_back_in_order_across_memory_and_the_file() {
        let dir = std::env::temp_dir();
        let mut s = Spool::new(&bounds(10, 1 << 20));
        let mut sent = Vec::new();
        for i in 0..50u8 {
            let piece = vec![i; (i as usize % 7) + 1];
            sent.extend_from_slice(&piece);
            assert!(s.has_room(piece.len()));
            s.push(Bytes::from(piece), &dir).unwrap();
            // Reading part of it in between: memory frees while the file still holds bytes.
            if i % 5 == 0 {
                let d = s.pop().unwrap().unwrap();
                let at = sent.len() - s.len() as usize - d.len();
                assert_eq!(&sent[at..at + d.len()], &d[..]);
            }
        }
        assert!(
            s.to_disk() > 0,
            "past 10 bytes of memory, bytes went to the file"
        );
        let rest = drain(&mut s);
        assert_eq!(&sent[sent.len() - rest.len()..], &rest[..]);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn a_spool_within_memory_never_makes_a_file() {
        let mut s = Spool::new(&bounds(100, 1 << 20));
        s.push(Bytes::from_static(b"hello"), Path::new("/nonexistent"))
            .unwrap();
        assert_eq!(s.to_disk(), 0);
        assert_eq!(drain(&mut s), b"hello");
    }

    #[test]
    fn room_ends_at_memory_plus_the_file_bound_but_an_empty_spool_takes_any_piece() {
        let dir = std::env::temp_dir();
        let mut s = Spool::new(&bounds(4, 8));
        assert!(
            s.has_room(100),
            "an empty spool takes a piece larger than both bounds"
        );
        s.push(Bytes::from_static(b"abcd"), &dir).unwrap();
        assert!(s.has_room(8));
        assert!(!s.has_room(9));
        s.push(Bytes::from_static(b"efghijkl"), &dir).unwrap();
        assert!(!s.has_room(1));
        assert_eq!(drain(&mut s), b"abcdefghijkl");
        assert!(s.has_room(4));
    }

    #[test]
    fn without_a_file_bound_memory_is_all_there_is() {
        let mut s = Spool::new(&bounds(4, 0));
        s.push(Bytes::from_static(b"ab"), Path::new("/nonexistent"))
            .unwrap();
        assert!(s.has_room(2));
        assert!(!s.has_room(3));
    }

    #[test]
    fn a_piece_larger_than_the_file_io_bound_is_written_in_pieces() {
        let dir = std::env::temp_dir();
        let mut s = Spool::new(&bounds(0, 1 << 20));
        let big: Vec<u8> = (0..(PIECE * 2 + 17)).map(|i| (i % 251) as u8).collect();
        s.push(Bytes::from(big.clone()), &dir).unwrap();
        assert_eq!(s.to_disk(), big.len() as u64);
        let first = s.pop().unwrap().unwrap();
        assert_eq!(first.len(), PIECE, "each read is at most PIECE");
        let mut got = first.to_vec();
        got.extend(drain(&mut s));
        assert_eq!(got, big);
    }
}
