use std::alloc::Layout as MemLayout;
use std::fmt;
use std::mem::ManuallyDrop;

use crate::{Block, BufferError, DType, Element, Layout, MIN_ALIGN, SharedAllocator};

/// An owned, contiguous, row-major array in host memory: a [`Block`] from a [`crate::HostAllocator`] plus
/// its [`DType`], shape and [`Layout`]. Dropping it returns the block to the allocator that made it.
///
/// # Example
/// ```
/// use spdl_buffer::{Buffer, DType, Layout, system_allocator};
///
/// let mut buf = Buffer::zeros(DType::F32, &[2, 3], Layout::Plain, &system_allocator())?;
/// buf.as_mut_slice::<f32>()?.copy_from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
/// assert_eq!(buf.shape(), &[2, 3]);
/// assert_eq!(buf.as_slice::<f32>()?[4], 5.0);
/// assert!(buf.as_slice::<u8>().is_err()); // typed views check the dtype
/// # Ok::<(), spdl_buffer::BufferError>(())
/// ```
pub struct Buffer {
    block: ManuallyDrop<Block>,
    allocator: SharedAllocator,
    dtype: DType,
    shape: Vec<usize>,
    layout: Layout,
    nbytes: usize,
}

fn byte_size(dtype: DType, shape: &[usize]) -> Result<usize, BufferError> {
    shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| BufferError::SizeOverflow { shape: shape.to_vec() })
}

impl Buffer {
    /// Allocates a zero-filled buffer from `allocator`.
    pub fn zeros(
        dtype: DType,
        shape: &[usize],
        layout: Layout,
        allocator: &SharedAllocator,
    ) -> Result<Buffer, BufferError> {
        let nbytes = byte_size(dtype, shape)?;
        let mem = MemLayout::from_size_align(nbytes, MIN_ALIGN.max(dtype.size()))
            .map_err(|_| BufferError::SizeOverflow { shape: shape.to_vec() })?;
        let block = allocator.allocate_zeroed(mem)?;
        Ok(Buffer {
            block: ManuallyDrop::new(block),
            allocator: allocator.clone(),
            dtype,
            shape: shape.to_vec(),
            layout,
            nbytes,
        })
    }

    /// Allocates a buffer from `allocator` holding a copy of `data`, with the given shape.
    pub fn from_slice<T: Element>(
        data: &[T],
        shape: &[usize],
        layout: Layout,
        allocator: &SharedAllocator,
    ) -> Result<Buffer, BufferError> {
        let mut buf = Buffer::zeros(T::DTYPE, shape, layout, allocator)?;
        let dst = buf.as_mut_slice::<T>()?;
        if dst.len() != data.len() {
            return Err(BufferError::ShapeMismatch { expected: dst.len(), actual: data.len() });
        }
        dst.copy_from_slice(data);
        Ok(buf)
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Extent of each axis.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// What the axes mean.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.nbytes / self.dtype.size()
    }

    /// True if the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.nbytes == 0
    }

    /// Size of the data in bytes.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// Row-major strides in bytes, one per axis.
    pub fn strides_bytes(&self) -> Vec<usize> {
        let mut strides = vec![0; self.shape.len()];
        let mut acc = self.dtype.size();
        for (s, &d) in strides.iter_mut().zip(&self.shape).rev() {
            *s = acc;
            acc = acc.saturating_mul(d);
        }
        strides
    }

    /// The allocator the memory came from (and goes back to).
    pub fn allocator(&self) -> &SharedAllocator {
        &self.allocator
    }

    /// True if the memory is page-locked.
    pub fn is_pinned(&self) -> bool {
        self.allocator.is_pinned()
    }

    /// Start of the data (aligned to at least [`MIN_ALIGN`]).
    pub fn as_ptr(&self) -> *const u8 {
        self.block.as_ptr()
    }

    /// Start of the data, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.block.as_ptr()
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        if self.nbytes == 0 {
            return &[];
        }
        // SAFETY: the block holds `nbytes` initialized (zeroed or written) bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.block.as_ptr(), self.nbytes) }
    }

    /// The raw bytes, for writing.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        if self.nbytes == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_bytes`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.block.as_ptr(), self.nbytes) }
    }

    fn check<T: Element>(&self) -> Result<(), BufferError> {
        if T::DTYPE == self.dtype {
            Ok(())
        } else {
            Err(BufferError::DTypeMismatch { expected: T::DTYPE, actual: self.dtype })
        }
    }

    /// The elements as `&[T]`; fails if `T` is not the buffer's dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], BufferError> {
        self.check::<T>()?;
        if self.nbytes == 0 {
            return Ok(&[]);
        }
        // SAFETY: dtype matches T, the block is aligned to >= 64 >= align_of::<T>(), every bit pattern is a
        // valid `T` (Element is sealed to plain numbers), and the length is nbytes / size_of::<T>().
        Ok(unsafe { std::slice::from_raw_parts(self.block.as_ptr() as *const T, self.len()) })
    }

    /// The elements as `&mut [T]`; fails if `T` is not the buffer's dtype.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T], BufferError> {
        self.check::<T>()?;
        if self.nbytes == 0 {
            return Ok(&mut []);
        }
        let len = self.len();
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.block.as_ptr() as *mut T, len) })
    }

    /// Bytes of one item along the first axis (one sample of a batch).
    pub fn outer_stride_bytes(&self) -> usize {
        match self.shape.first() {
            Some(&n) if n > 0 => self.nbytes / n,
            _ => 0,
        }
    }

    /// The bytes of item `i` along the first axis, or `None` if out of range.
    pub fn outer_slot(&self, i: usize) -> Option<&[u8]> {
        let n = *self.shape.first()?;
        if i >= n {
            return None;
        }
        let s = self.outer_stride_bytes();
        self.as_bytes().get(i * s..(i + 1) * s)
    }

    /// Splits the buffer along its first axis into disjoint mutable byte slices, one per item, so that
    /// each sample of a batch can be decoded straight into its slot (from several threads at once).
    pub fn outer_slots_mut(&mut self) -> Vec<&mut [u8]> {
        let s = self.outer_stride_bytes();
        if s == 0 {
            let n = self.shape.first().copied().unwrap_or(0);
            return (0..n).map(|_| <&mut [u8]>::default()).collect();
        }
        self.as_bytes_mut().chunks_exact_mut(s).collect()
    }

    /// Like [`Self::outer_slots_mut`], typed: fails if `T` is not the buffer's dtype.
    pub fn outer_slots_mut_as<T: Element>(&mut self) -> Result<Vec<&mut [T]>, BufferError> {
        let n = self.shape.first().copied().unwrap_or(0);
        let slice = self.as_mut_slice::<T>()?;
        if n == 0 || slice.is_empty() {
            return Ok((0..n).map(|_| <&mut [T]>::default()).collect());
        }
        let per = slice.len() / n;
        Ok(slice.chunks_exact_mut(per).collect())
    }

    /// Changes the shape (and axis names) without moving data; the element count must stay the same.
    pub fn reshape(&mut self, shape: &[usize], layout: Layout) -> Result<(), BufferError> {
        let nbytes = byte_size(self.dtype, shape)?;
        if nbytes != self.nbytes {
            return Err(BufferError::ShapeMismatch { expected: self.len(), actual: nbytes / self.dtype.size() });
        }
        self.shape = shape.to_vec();
        self.layout = layout;
        Ok(())
    }

    /// A deep copy in memory from the same allocator.
    pub fn try_clone(&self) -> Result<Buffer, BufferError> {
        self.copy_to(&self.allocator)
    }

    /// A deep copy in memory from another allocator (e.g. into pinned memory).
    pub fn copy_to(&self, allocator: &SharedAllocator) -> Result<Buffer, BufferError> {
        let mut out = Buffer::zeros(self.dtype, &self.shape, self.layout, allocator)?;
        out.as_bytes_mut().copy_from_slice(self.as_bytes());
        Ok(out)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: `block` is taken exactly once, here, and never used afterwards.
        let block = unsafe { ManuallyDrop::take(&mut self.block) };
        self.allocator.release(block);
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("layout", &self.layout)
            .field("nbytes", &self.nbytes)
            .field("allocator", &self.allocator.name())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HostAllocator, SystemAllocator, system_allocator};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Debug, Default)]
    struct Counting {
        live: AtomicUsize,
        total: AtomicUsize,
    }
    impl HostAllocator for Counting {
        fn allocate(&self, layout: MemLayout) -> Result<Block, BufferError> {
            self.live.fetch_add(1, Ordering::SeqCst);
            self.total.fetch_add(1, Ordering::SeqCst);
            SystemAllocator.allocate(layout)
        }
        fn release(&self, block: Block) {
            self.live.fetch_sub(1, Ordering::SeqCst);
            SystemAllocator.release(block)
        }
        fn name(&self) -> &str {
            "counting"
        }
    }

    #[test]
    fn freed_through_the_allocator_that_made_it() {
        let counting = Arc::new(Counting::default());
        let alloc: SharedAllocator = counting.clone();
        {
            let b = Buffer::zeros(DType::U16, &[7, 5], Layout::Plain, &alloc).unwrap();
            assert_eq!(counting.live.load(Ordering::SeqCst), 1);
            assert!(b.as_slice::<u16>().unwrap().iter().all(|&v| v == 0)); // default allocate_zeroed zeroes
            let c = b.copy_to(&system_allocator()).unwrap();
            assert_eq!(c.allocator().name(), "system");
        }
        assert_eq!(counting.live.load(Ordering::SeqCst), 0);
        assert_eq!(counting.total.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn alignment_and_sizes() {
        for dt in [DType::U8, DType::I16, DType::F32, DType::F64, DType::I64] {
            for n in [0usize, 1, 3, 64, 1000] {
                let b = Buffer::zeros(dt, &[n, 3], Layout::Plain, &system_allocator()).unwrap();
                assert_eq!(b.as_ptr() as usize % MIN_ALIGN, 0);
                assert_eq!(b.nbytes(), n * 3 * dt.size());
                assert_eq!(b.len(), n * 3);
            }
        }
    }

    #[test]
    fn overflow_is_an_error_not_a_panic() {
        let e = Buffer::zeros(DType::F64, &[usize::MAX / 4, 4], Layout::Plain, &system_allocator());
        assert!(matches!(e, Err(BufferError::SizeOverflow { .. })));
    }

    #[test]
    fn slots_are_disjoint_and_cover_the_buffer() {
        let mut b = Buffer::zeros(DType::F32, &[4, 2, 3], Layout::Plain, &system_allocator()).unwrap();
        std::thread::scope(|s| {
            for (i, slot) in b.outer_slots_mut_as::<f32>().unwrap().into_iter().enumerate() {
                s.spawn(move || slot.fill(i as f32));
            }
        });
        let v = b.as_slice::<f32>().unwrap();
        for i in 0..4 {
            assert!(v[i * 6..(i + 1) * 6].iter().all(|&x| x == i as f32));
        }
        assert_eq!(b.outer_slot(3).unwrap().len(), 24);
        assert!(b.outer_slot(4).is_none());
        assert_eq!(b.strides_bytes(), vec![24, 12, 4]);
    }

    #[test]
    fn reshape_keeps_count() {
        let mut b = Buffer::from_slice(&[1u8, 2, 3, 4, 5, 6], &[6], Layout::Plain, &system_allocator()).unwrap();
        b.reshape(&[2, 3], Layout::Plain).unwrap();
        assert_eq!(b.shape(), &[2, 3]);
        assert!(b.reshape(&[4], Layout::Plain).is_err());
        assert!(Buffer::from_slice(&[1u8, 2], &[3], Layout::Plain, &system_allocator()).is_err());
    }

    #[test]
    fn empty_batch_has_no_slots() {
        let mut b = Buffer::zeros(DType::U8, &[0, 4], Layout::Plain, &system_allocator()).unwrap();
        assert!(b.outer_slots_mut().is_empty());
        assert!(b.is_empty());
        let mut z = Buffer::zeros(DType::U8, &[3, 0], Layout::Plain, &system_allocator()).unwrap();
        assert_eq!(z.outer_slots_mut().len(), 3);
    }
}
