//! gzip by zlib's deflate, the C library nginx links, called directly rather than through
//! flate2's writer: so that the stream's state is sized to the response as nginx sizes it, is
//! reused by the worker's next response, and writes straight into the buffer that goes to the
//! client.
//!
//! - **Sized.** For a body of known length, nginx's gzip filter lowers zlib's window bits and
//!   memory level together while the body fits in half the window (less deflate's 262-byte
//!   lookahead): a 3 KB response gets a 4 KiB window and memory level 5, about 38 KiB of state
//!   instead of the 268 KiB of the defaults (15 and 8), and zlib clears an 8 KiB hash table
//!   instead of a 64 KiB one. [`Shape::of`] does the same; a body of unknown length gets the
//!   defaults. The output is the same as nginx's at the same level.
//! - **Reused.** A finished stream goes back to its worker's [`IDLE`] list (a few per shape),
//!   reset (`deflateReset`: its hash table cleared, its buffers kept), and the next response of
//!   that shape takes it instead of allocating a new one. A worker thus holds at most
//!   [`IDLE_MAX`] idle streams.
//! - **No copy.** [`Gzip::deflate`] writes into the spare capacity of the caller's buffer.
//!
//! zlib writes raw deflate data; the gzip header and trailer are pinlb's, as zlib writes them
//! for nginx (the same 10 bytes, so a response's bytes are nginx's), with the CRC-32 by `crc32fast`
//! (SIMD): zlib's own takes nine times as long (0.9 µs for 3 KB here). zlib's memory comes
//! from Rust's allocator (mimalloc), as all of pinlb's does.

use std::alloc::{Layout, alloc, dealloc};
use std::cell::RefCell;
use std::ffi::{c_int, c_uint, c_void};
use std::io;
use std::ptr;

use libz_sys as z;

/// zlib's defaults, and nginx's (`gzip_window 32k`, `gzip_hash 8`... in its terms).
const MAX_WBITS: c_int = 15;
const DEFAULT_MEM_LEVEL: c_int = 8;

/// Idle streams a worker keeps for reuse, all shapes together.
pub const IDLE_MAX: usize = 8;

/// A stream's level and size: what must match for one to be reused for another response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    level: c_int,
    window_bits: c_int,
    mem_level: c_int,
}

impl Shape {
    /// nginx's sizing (`ngx_http_gzip_filter_module`): while a body of known, non-zero length
    /// fits in half the window less 262 bytes, the window bits and the memory level go down
    /// by one each; the memory level stays 1 or more, and the window bits end at 9 or more
    /// (the loop stops there by itself, since half of 2^9 less 262 is negative).
    pub fn of(level: u32, length: Option<u64>) -> Shape {
        let (mut window_bits, mut mem_level) = (MAX_WBITS, DEFAULT_MEM_LEVEL);
        if let Some(n) = length.filter(|&n| n > 0) {
            while (n as i64) < (1i64 << (window_bits - 1)) - 262 {
                window_bits -= 1;
                mem_level -= 1;
            }
            mem_level = mem_level.max(1);
        }
        Shape {
            level: c_int::try_from(level.min(9)).unwrap_or(1),
            window_bits,
            mem_level,
        }
    }
}

thread_local! {
    /// This worker's idle streams, each reset and ready for a response of its shape.
    static IDLE: RefCell<Vec<(Shape, Stream)>> = const { RefCell::new(Vec::new()) };
}

/// A zlib deflate stream, boxed: zlib keeps a pointer back to it in its state.
struct Stream(Box<z::z_stream>);

impl Stream {
    fn new(shape: Shape) -> io::Result<Stream> {
        let mut s = Box::new(z::z_stream {
            next_in: ptr::null_mut(),
            avail_in: 0,
            total_in: 0,
            next_out: ptr::null_mut(),
            avail_out: 0,
            total_out: 0,
            msg: ptr::null_mut(),
            state: ptr::null_mut(),
            zalloc,
            zfree,
            opaque: ptr::null_mut(),
            data_type: 0,
            adler: 0,
            reserved: 0,
        });
        let size = c_int::try_from(std::mem::size_of::<z::z_stream>()).unwrap_or(c_int::MAX);
        // SAFETY: `s` is a fresh, boxed z_stream with our allocator functions and no input or
        // output yet, as deflateInit2 requires; it stays at this address while zlib uses it
        // (the box moves, its contents do not). zlibVersion returns a static string.
        let rc = unsafe {
            z::deflateInit2_(
                &mut *s,
                shape.level,
                z::Z_DEFLATED,
                -shape.window_bits,
                shape.mem_level,
                z::Z_DEFAULT_STRATEGY,
                z::zlibVersion(),
                size,
            )
        };
        if rc != z::Z_OK {
            return Err(zlib_error("deflateInit2", rc));
        }
        Ok(Stream(s))
    }

    /// Ready for another response: zlib's `deflateReset`.
    fn reset(&mut self) -> bool {
        // SAFETY: the stream was initialised by deflateInit2 and not ended.
        unsafe { z::deflateReset(&mut *self.0) == z::Z_OK }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the stream was initialised by deflateInit2 (a `Stream` exists only then) and
        // is ended once, here.
        unsafe {
            z::deflateEnd(&mut *self.0);
        }
    }
}

/// gzip's header as zlib writes it for nginx: the magic, deflate, no flags, no time, the
/// extra flags (byte 8, [`header`]), Unix.
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];

/// The header for `level`, its extra flags as zlib sets them: 4 (fastest) below level 2, 2
/// (best) at 9, else 0. So the bytes are those nginx sends.
fn header(level: c_int) -> [u8; 10] {
    let mut h = HEADER;
    h[8] = match level {
        ..2 => 4,
        9.. => 2,
        _ => 0,
    };
    h
}

/// One response's gzip stream; it goes back to its worker's idle list when dropped.
pub struct Gzip {
    shape: Shape,
    stream: Option<Stream>,
    /// The CRC-32 and length (mod 2^32) of what went in, for the trailer.
    crc: crc32fast::Hasher,
    size: u32,
    /// Whether the header is out, and the trailer.
    begun: bool,
    ended: bool,
}

/// When [`Gzip::deflate`] hands its output over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// When zlib decides: the input may stay in its window.
    None,
    /// Everything taken so far, decodable by the client now (gzip's sync flush).
    Sync,
    /// The end of the stream, with gzip's trailer.
    Finish,
}

impl Gzip {
    /// A stream at `level` for a body of `length` bytes when known: an idle one of its shape
    /// when this worker has one, else a new one.
    pub fn new(level: u32, length: Option<u64>) -> io::Result<Gzip> {
        let shape = Shape::of(level, length);
        let idle = IDLE.with_borrow_mut(|idle| {
            let i = idle.iter().position(|(s, _)| *s == shape)?;
            Some(idle.swap_remove(i).1)
        });
        let stream = match idle {
            Some(s) => s,
            None => Stream::new(shape)?,
        };
        Ok(Gzip {
            shape,
            stream: Some(stream),
            crc: crc32fast::Hasher::new(),
            size: 0,
            begun: false,
            ended: false,
        })
    }

    /// Compresses all of `input` into `out`, after what it holds, growing it as needed.
    pub fn deflate(&mut self, input: &[u8], out: &mut Vec<u8>, flush: Flush) -> io::Result<()> {
        let Some(Stream(s)) = &mut self.stream.as_mut().filter(|_| !self.ended) else {
            return Err(io::Error::other("gzip stream already finished"));
        };
        if !self.begun {
            self.begun = true;
            out.extend_from_slice(&header(self.shape.level));
        }
        self.crc.update(input);
        self.size = self.size.wrapping_add(input.len() as u32);
        let mode = match flush {
            Flush::None => z::Z_NO_FLUSH,
            Flush::Sync => z::Z_SYNC_FLUSH,
            Flush::Finish => z::Z_FINISH,
        };
        let mut rest = input;
        // Bounded: every turn either takes input, or writes output into room it was given,
        // or ends the stream; a turn that does none of those is an error (below).
        loop {
            // A piece zlib's 32-bit counts can hold.
            let piece = rest.len().min(c_uint::MAX as usize);
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(4096));
            }
            let room = (out.capacity() - out.len()).min(c_uint::MAX as usize);
            s.next_in = rest.as_ptr().cast_mut();
            s.avail_in = piece as c_uint;
            // SAFETY: `out`'s spare capacity is `room` bytes from its end: zlib writes only
            // there (avail_out bounds it).
            s.next_out = unsafe { out.as_mut_ptr().add(out.len()) };
            s.avail_out = room as c_uint;
            let last = piece == rest.len();
            // SAFETY: the stream is initialised; next_in/avail_in describe `rest`, which zlib
            // only reads, and next_out/avail_out the spare capacity above.
            let rc = unsafe { z::deflate(&mut **s, if last { mode } else { z::Z_NO_FLUSH }) };
            let taken = piece - s.avail_in as usize;
            let written = room - s.avail_out as usize;
            // SAFETY: zlib wrote `written` bytes into the spare capacity, initialising them.
            unsafe { out.set_len(out.len() + written) };
            rest = &rest[taken..];
            s.next_in = ptr::null_mut();
            s.next_out = ptr::null_mut();
            match rc {
                z::Z_STREAM_END => {
                    self.ended = true;
                    let crc = std::mem::take(&mut self.crc).finalize();
                    out.extend_from_slice(&crc.to_le_bytes());
                    out.extend_from_slice(&self.size.to_le_bytes());
                    return Ok(());
                }
                // Z_BUF_ERROR: no progress was possible; with room given and input or a flush
                // asked for, that only happens once everything is out.
                z::Z_OK | z::Z_BUF_ERROR => {
                    if rest.is_empty() && s.avail_out != 0 && mode != z::Z_FINISH {
                        return Ok(());
                    }
                    // Room and input or a flush to do, and nothing done: never loop on it.
                    if taken == 0 && written == 0 {
                        return Err(zlib_error("deflate (no progress)", rc));
                    }
                }
                rc => return Err(zlib_error("deflate", rc)),
            }
        }
    }
}

impl Drop for Gzip {
    fn drop(&mut self) {
        let Some(mut stream) = self.stream.take() else {
            return;
        };
        if !stream.reset() {
            return;
        }
        let shape = self.shape;
        // The worker's thread-local may be gone at thread exit: the stream is then ended.
        let _ = IDLE.try_with(|idle| {
            let mut idle = idle.borrow_mut();
            if idle.len() < IDLE_MAX {
                idle.push((shape, stream));
            }
        });
    }
}

fn zlib_error(call: &str, rc: c_int) -> io::Error {
    io::Error::other(format!("zlib {call} returned {rc}"))
}

/// zlib's allocations go to Rust's allocator, each with its size in a header: zfree is not
/// told it.
const SIZE_HEADER: usize = 16;

unsafe extern "C" fn zalloc(_: *mut c_void, items: c_uint, size: c_uint) -> *mut c_void {
    let Some(n) = (items as usize)
        .checked_mul(size as usize)
        .and_then(|n| n.checked_add(SIZE_HEADER))
    else {
        return ptr::null_mut();
    };
    let Ok(layout) = Layout::from_size_align(n, SIZE_HEADER) else {
        return ptr::null_mut();
    };
    // SAFETY: the layout's size is at least SIZE_HEADER, not zero.
    let p = unsafe { alloc(layout) };
    if p.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: `p` holds at least SIZE_HEADER bytes, aligned for a usize; the caller gets what
    // follows the header.
    unsafe {
        p.cast::<usize>().write(n);
        p.add(SIZE_HEADER).cast()
    }
}

unsafe extern "C" fn zfree(_: *mut c_void, address: *mut c_void) {
    if address.is_null() {
        return;
    }
    // SAFETY: zlib frees only what zalloc gave it: SIZE_HEADER bytes after an allocation whose
    // first word is its size, with SIZE_HEADER alignment.
    unsafe {
        let p = address.cast::<u8>().sub(SIZE_HEADER);
        let n = p.cast::<usize>().read();
        dealloc(p, Layout::from_size_align_unchecked(n, SIZE_HEADER));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn gunzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(data)
            .read_to_end(&mut out)
            .expect("a valid gzip stream");
        out
    }

    fn doc(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| b"{\"id\": 1, \"name\": \"alpha beta\"},"[i % 32] ^ ((i / 997) as u8 % 3))
            .collect()
    }

    #[test]
    fn a_known_length_shrinks_the_window_and_memory_as_nginx_does() {
        // nginx's loop by hand: 3352 < 2^14-262, 2^13-262, 2^12-262, not 2^11-262.
        assert_eq!(
            Shape::of(1, Some(3352)),
            Shape {
                level: 1,
                window_bits: 12,
                mem_level: 5
            }
        );
        assert_eq!(
            Shape::of(1, None),
            Shape {
                level: 1,
                window_bits: 15,
                mem_level: 8
            }
        );
        assert_eq!(Shape::of(6, Some(1 << 20)).window_bits, 15);
        // A tiny body: the window stops at 9 bits, the memory level at 1.
        assert_eq!(
            Shape::of(1, Some(20)),
            Shape {
                level: 1,
                window_bits: 9,
                mem_level: 2
            }
        );
        assert_eq!(Shape::of(1, Some(0)), Shape::of(1, None));
    }

    #[test]
    fn every_shape_and_flush_decodes_back_to_the_input() {
        for len in [0, 1, 20, 3352, 40_000, 300_000] {
            let input = doc(len);
            for known in [Some(len as u64), None] {
                let mut g = Gzip::new(1, known).unwrap();
                let mut out = Vec::new();
                // In pieces, with a sync flush after each, as a streamed response goes.
                for piece in input.chunks(7000) {
                    g.deflate(piece, &mut out, Flush::Sync).unwrap();
                }
                g.deflate(&[], &mut out, Flush::Finish).unwrap();
                assert_eq!(gunzip(&out), input, "len {len}, known {known:?}");
                // Without flushes: the same bytes back.
                let mut g = Gzip::new(1, known).unwrap();
                let mut whole = Vec::new();
                for piece in input.chunks(5000) {
                    g.deflate(piece, &mut whole, Flush::None).unwrap();
                }
                g.deflate(&[], &mut whole, Flush::Finish).unwrap();
                assert_eq!(gunzip(&whole), input, "len {len}, known {known:?}");
            }
        }
    }

    #[test]
    fn the_output_matches_flate2_at_the_same_level_and_window() {
        // The same zlib with the same parameters writes the same deflate data: the body is
        // what flate2's encoder made before (with the defaults' window), not another coding.
        let input = doc(100_000);
        let mut g = Gzip::new(1, None).unwrap();
        let mut ours = Vec::new();
        g.deflate(&input, &mut ours, Flush::Finish).unwrap();
        assert!(
            g.deflate(&[], &mut ours, Flush::Finish).is_err(),
            "ended once"
        );
        let mut theirs = flate2::Compress::new(flate2::Compression::new(1), false);
        let mut raw = Vec::with_capacity(200_000);
        theirs
            .compress_vec(&input, &mut raw, flate2::FlushCompress::Finish)
            .unwrap();
        // gzip = zlib's 10-byte header (level 1: "fastest") + raw deflate + CRC-32 and length.
        assert_eq!(ours[..10], [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 3]);
        assert_eq!(header(6)[8], 0);
        assert_eq!(header(9)[8], 2);
        assert_eq!(&ours[10..ours.len() - 8], &raw[..]);
        let trailer = &ours[ours.len() - 8..];
        assert_eq!(trailer[..4], crc32fast::hash(&input).to_le_bytes());
        assert_eq!(trailer[4..], (input.len() as u32).to_le_bytes());
    }

    #[test]
    fn a_finished_stream_is_reused_by_the_next_response_of_its_shape() {
        IDLE.with_borrow_mut(Vec::clear);
        let input = doc(3352);
        let first = {
            let mut g = Gzip::new(1, Some(3352)).unwrap();
            let mut out = Vec::new();
            g.deflate(&input, &mut out, Flush::Finish).unwrap();
            out
        };
        assert_eq!(IDLE.with_borrow(Vec::len), 1);
        let mut g = Gzip::new(1, Some(3352)).unwrap();
        assert_eq!(IDLE.with_borrow(Vec::len), 0, "taken from the idle list");
        let mut out = Vec::new();
        g.deflate(&input, &mut out, Flush::Finish).unwrap();
        assert_eq!(out, first, "a reset stream starts afresh");
        drop(g);
        // Another shape does not take it; the list is bounded.
        let others: Vec<Gzip> = (0..IDLE_MAX + 2)
            .map(|_| Gzip::new(1, None).unwrap())
            .collect();
        assert_eq!(IDLE.with_borrow(Vec::len), 1);
        drop(others);
        assert_eq!(IDLE.with_borrow(Vec::len), IDLE_MAX);
    }
}
