//! Memory helpers for kernels: a 64-byte aligned zeroed byte buffer, and a shared output
//! pointer through which parallel tasks write disjoint parts of one slice.
//!
//! A key design decision: packed weights live in one [`AlignedBuf`] per matrix rather than a
//! `Vec<T>` of a wider element type, because AMX `tileloadd` and AVX-512 aligned loads want
//! 64-byte alignment and the formats mix element widths (bf16 pairs, int8 quads, int4 nibbles).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::marker::PhantomData;
use std::ptr::NonNull;

/// Alignment of every packed buffer: one cache line, one AVX-512 register, one tile row.
pub const ALIGN: usize = 64;

/// A zero-initialised, 64-byte aligned (or more), fixed-size byte buffer.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    align: usize,
    /// Bytes allocated in front of `ptr` (0: `ptr` is the allocation, of `len` bytes at
    /// `align`; else the allocation starts `offset` bytes before and holds `len + align`).
    offset: usize,
}

/// Alignment `calloc` gives: the allocator's zero pages, untouched until written.
const CALLOC_ALIGN: usize = 16;

// SAFETY: the buffer owns its allocation exclusively, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zero bytes aligned to [`ALIGN`].
    pub fn zeroed(len: usize) -> Self {
        Self::zeroed_aligned(len, ALIGN)
    }

    /// Allocates `len` zero bytes aligned to `align` (a power of two, at least [`ALIGN`]):
    /// 4096 for direct I/O, whose reads land in whole pages. Above [`ALIGN`] the buffer is
    /// over-allocated through `calloc` and aligned inside, so a large one comes from the
    /// allocator's zero pages and takes memory only as it is written (an aligned allocation
    /// is zeroed by writing every page: 5 GiB of cache slots took 4 s to start).
    pub fn zeroed_aligned(len: usize, align: usize) -> Self {
        let align = align.max(ALIGN);
        if len == 0 {
            return Self {
                ptr: NonNull::<[u8; ALIGN]>::dangling().cast(),
                len: 0,
                align,
                offset: 0,
            };
        }
        let (size, at) = if align > ALIGN {
            (
                len.checked_add(align).expect("buffer size overflows"),
                CALLOC_ALIGN,
            )
        } else {
            (len, align)
        };
        let layout = Layout::from_size_align(size, at).expect("buffer size overflows isize");
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let base = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        let offset = if align > ALIGN {
            base.as_ptr().align_offset(align)
        } else {
            0
        };
        // SAFETY: `offset < align`, so `offset + len <= size` stays inside the allocation.
        let ptr = unsafe { base.add(offset) };
        Self {
            ptr,
            len,
            align,
            offset,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes (zeroed at allocation) or dangling
        // and aligned with `len == 0`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Pointer to the first byte (64-byte aligned).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        let mut c = Self::zeroed_aligned(self.len, self.align);
        c.as_mut_slice().copy_from_slice(self.as_slice());
        c
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            let layout = if self.align > ALIGN {
                Layout::from_size_align(self.len + self.align, CALLOC_ALIGN)
            } else {
                Layout::from_size_align(self.len, self.align)
            };
            let layout = layout.expect("checked at allocation");
            // SAFETY: allocated in `zeroed_aligned` with this very layout, `offset` bytes
            // before `ptr`.
            unsafe { dealloc(self.ptr.as_ptr().sub(self.offset), layout) };
        }
    }
}

/// `n` zeros, written by the pool's threads where `n` is large: a prompt's activations
/// (megabytes a layer) zeroed, and their fresh pages faulted in, on the calling thread alone
/// left the other cores waiting.
pub fn zeroed_f32(n: usize) -> Vec<f32> {
    const PER_TASK: usize = 1 << 16;
    if n <= PER_TASK {
        return vec![0.0; n];
    }
    let mut v: Vec<f32> = Vec::with_capacity(n);
    crate::parallel_chunks_mut(&mut v.spare_capacity_mut()[..n], PER_TASK, |_, part| {
        for x in part {
            x.write(0.0);
        }
    });
    // SAFETY: the first `n` elements were written above (every piece of `..n` by its task).
    unsafe { v.set_len(n) };
    v
}

/// A mutable slice shared between parallel tasks that each write a disjoint part of it.
pub(crate) struct SharedMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _life: PhantomData<&'a mut [T]>,
}

// SAFETY: tasks only write through `part`, whose contract requires disjoint ranges.
unsafe impl<T: Send> Sync for SharedMut<'_, T> {}

impl<'a, T> SharedMut<'a, T> {
    pub(crate) fn new(s: &'a mut [T]) -> Self {
        Self {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _life: PhantomData,
        }
    }

    /// The sub-slice `start..start + len`.
    ///
    /// # Safety
    /// No two live results of `part` on the same `SharedMut` may overlap.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn part(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start + len <= self.len, "shared part out of bounds");
        // SAFETY: in bounds (checked above) of a slice borrowed mutably for 'a; the caller
        // guarantees no overlapping part is alive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

/// Caps glibc's malloc arenas at `n` for the allocations that follow, unless the user set
/// `MALLOC_ARENA_MAX` (which glibc has read already); whether the cap was set.
///
/// A server's many threads each get an arena of their own by default and keep what one
/// thread freed from another thread's allocations: a prefix cache of 128 MiB then cost ~165
/// MiB resident in `strata serve`, 123-140 MiB with one arena (docs/benchmarks.md).
pub fn limit_malloc_arenas(n: usize) -> bool {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return false;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` takes two integers and changes a tuning parameter of the process's
        // allocator; M_ARENA_MAX affects only arenas created afterwards.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, n.clamp(1, i32::MAX as usize) as i32) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = n;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_malloc_arena_cap_is_set_unless_the_user_set_one() {
        let user = std::env::var_os("MALLOC_ARENA_MAX").is_some();
        let glibc = cfg!(all(target_os = "linux", target_env = "gnu"));
        // Eight: as many as the test threads could want, so the rest of the run is unchanged.
        assert_eq!(limit_malloc_arenas(8), glibc && !user);
    }

    #[test]
    fn page_aligned_buffers_are_aligned_zeroed_and_writable() {
        for len in [1, 4095, 4096, 3 << 20] {
            let mut b = AlignedBuf::zeroed_aligned(len, 4096);
            assert_eq!(b.as_ptr() as usize % 4096, 0, "{len}");
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice()[len - 1] = 7;
            let c = b.clone();
            assert_eq!(c.as_ptr() as usize % 4096, 0);
            assert_eq!(c.as_slice()[len - 1], 7);
        }
        let small = AlignedBuf::zeroed(100);
        assert_eq!(small.as_ptr() as usize % ALIGN, 0);
    }
}
