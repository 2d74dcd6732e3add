//! Memory for a future that is made again and again, kept by the thread between uses.
//!
//! A client connection's exchange (one request and its response) is a future of several KB
//! that lives only while its request does; boxed anew for each request it cost the allocator's
//! path for blocks that size (about 300 instructions for the allocation and its free,
//! `benches/callgrind.sh`). [`Recycler::make`] puts the future in a block another exchange of the
//! same worker freed, and [`Recycled`] gives the block back when the future is dropped. The
//! blocks kept are bounded ([`Recycler::new`]), so a worker's spare memory stays what a burst of
//! that many requests at once leaves, not what its open connections would hold each.
//!
//! A `Box<MaybeUninit<F>>` could not be kept: its type names the borrows of the request it
//! served, so blocks are kept as untyped memory of one [`Layout`].

use std::alloc::{self, Layout};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

/// A thread's spare blocks of one layout, the layout of the first future it made. Not `Send`:
/// a worker's own, like its connections.
pub struct Recycler {
    /// The layout of every block in `blocks`; `None` until the first future is made.
    layout: Cell<Option<Layout>>,
    blocks: RefCell<Vec<NonNull<u8>>>,
    /// Most blocks kept; one freed beyond this goes back to the allocator.
    max: usize,
}

impl Recycler {
    /// Keeps at most `max` spare blocks.
    pub fn new(max: usize) -> Recycler {
        Recycler {
            layout: Cell::new(None),
            blocks: RefCell::new(Vec::new()),
            max,
        }
    }

    /// `make`'s future, made in a spare block when there is one of its layout (a new block
    /// otherwise), where it stays until it is dropped. The block is taken before the future is
    /// made, so that the future is made in it rather than on the stack and then copied.
    #[inline(always)]
    pub fn make<F: Future>(&self, make: impl FnOnce() -> F) -> Recycled<'_, F> {
        const { assert!(size_of::<F>() > 0, "a future of no size needs no block") };
        let layout = Layout::new::<F>();
        let block = self.take(layout).cast::<F>();
        // SAFETY: `block` is valid for writes of `layout`, the size and alignment of `F`
        // (`take`), and holds nothing: a block kept by `give` had its future dropped first.
        unsafe { block.as_ptr().write(make()) };
        Recycled {
            future: block,
            recycler: self,
        }
    }

    /// A block of `layout`: a spare one if it has that layout, else a new one.
    fn take(&self, layout: Layout) -> NonNull<u8> {
        if self.layout.get() == Some(layout) {
            if let Some(block) = self.blocks.borrow_mut().pop() {
                return block;
            }
        }
        // SAFETY: `layout` has a non-zero size (the assertion in `make`).
        let block = unsafe { alloc::alloc(layout) };
        NonNull::new(block).unwrap_or_else(|| alloc::handle_alloc_error(layout))
    }

    /// Keeps a block of `layout` whose future was dropped, or frees it.
    fn give(&self, block: NonNull<u8>, layout: Layout) {
        let mut blocks = self.blocks.borrow_mut();
        match self.layout.get() {
            None => self.layout.set(Some(layout)),
            Some(kept) if kept != layout => {
                // SAFETY: `block` was allocated by `take` with `layout`, and is not used again.
                unsafe { alloc::dealloc(block.as_ptr(), layout) };
                return;
            }
            Some(_) => {}
        }
        if blocks.len() < self.max {
            blocks.push(block);
        } else {
            // SAFETY: as above.
            unsafe { alloc::dealloc(block.as_ptr(), layout) };
        }
    }

    /// Spare blocks kept now.
    #[cfg(test)]
    fn spare(&self) -> usize {
        self.blocks.borrow().len()
    }
}

impl Drop for Recycler {
    fn drop(&mut self) {
        if let Some(layout) = self.layout.get() {
            for block in self.blocks.get_mut().drain(..) {
                // SAFETY: every kept block was allocated with the kept layout, and holds no
                // future.
                unsafe { alloc::dealloc(block.as_ptr(), layout) };
            }
        }
    }
}

/// A future in a block of a [`Recycler`]'s, pinned there until it is dropped.
pub struct Recycled<'r, F: Future> {
    future: NonNull<F>,
    recycler: &'r Recycler,
}

impl<F: Future> Future for Recycled<'_, F> {
    type Output = F::Output;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: the future was written in `make` and stays where it is, unmoved, until `drop`
        // drops it there: it is pinned. `self` is the only pointer to it.
        unsafe { Pin::new_unchecked(&mut *self.future.as_ptr()) }.poll(cx)
    }
}

impl<F: Future> Drop for Recycled<'_, F> {
    fn drop(&mut self) {
        // SAFETY: the future was written in `make` and not dropped before; it is dropped where
        // it was pinned, and the block is given back only after.
        unsafe { std::ptr::drop_in_place(self.future.as_ptr()) };
        self.recycler
            .give(self.future.cast::<u8>(), Layout::new::<F>());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    /// Counts its drops in a shared cell.
    struct OnDrop(Rc<Cell<usize>>);

    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }

    /// Holds a drop counter from the moment it is made (its argument), polled or not; awaits
    /// once before it finishes.
    fn counted(drops: Rc<Cell<usize>>, payload: [u64; 64]) -> impl Future<Output = u64> {
        counting(OnDrop(drops), payload)
    }

    async fn counting(guard: OnDrop, payload: [u64; 64]) -> u64 {
        tokio::task::yield_now().await;
        drop(guard);
        payload.iter().sum()
    }

    fn block_of<F: Future>(r: &Recycled<'_, F>) -> usize {
        r.future.as_ptr() as usize
    }

    #[tokio::test]
    async fn a_future_runs_to_its_output_and_its_block_serves_the_next_one() {
        let recycler = Recycler::new(2);
        let drops = Rc::new(Cell::new(0));
        let first = recycler.make(|| counted(drops.clone(), [1; 64]));
        let at = block_of(&first);
        assert_eq!(first.await, 64);
        assert_eq!((drops.get(), recycler.spare()), (1, 1));
        let second = recycler.make(|| counted(drops.clone(), [2; 64]));
        assert_eq!(block_of(&second), at, "the spare block is taken");
        assert_eq!(recycler.spare(), 0);
        assert_eq!(second.await, 128);
        assert_eq!((drops.get(), recycler.spare()), (2, 1));
    }

    #[tokio::test]
    async fn a_future_dropped_before_it_ends_is_dropped_in_its_block() {
        let recycler = Recycler::new(2);
        let drops = Rc::new(Cell::new(0));
        let mut pending = Box::pin(recycler.make(|| counted(drops.clone(), [3; 64])));
        let waker = std::task::Waker::noop();
        assert!(
            pending
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_pending()
        );
        drop(pending);
        assert_eq!((drops.get(), recycler.spare()), (1, 1));
    }

    #[tokio::test]
    async fn no_more_blocks_than_the_bound_are_kept_and_other_layouts_go_back() {
        let recycler = Recycler::new(2);
        let drops = Rc::new(Cell::new(0));
        let many: Vec<_> = (0..5)
            .map(|_| recycler.make(|| counted(drops.clone(), [0; 64])))
            .collect();
        drop(many);
        assert_eq!((drops.get(), recycler.spare()), (5, 2));
        // Another layout is made and freed, not kept among blocks of the first.
        assert_eq!(recycler.make(|| async { [7u8; 3] }).await, [7; 3]);
        assert_eq!(recycler.spare(), 2);
    }
}
