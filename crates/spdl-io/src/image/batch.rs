//! Batch decoding: N encoded images into one contiguous batch buffer, each written straight into its slot.

use std::borrow::Cow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use fast_image_resize::Resizer;
use spdl_buffer::{Buffer, DType, Layout, SharedAllocator};

use crate::error::guarded;
use crate::image::decode;
use crate::image::pixels::{NormalizeLut, Pixels, SlotMut, byte_len, resize_into, sized};
use crate::image::{ImageOptions, Transform};
use crate::{Error, Result};

/// Per-channel normalization of a batch to `f32`: `(value / 255 - mean[c]) / std[c]`, as torchvision's
/// `ToTensor()` + `Normalize(mean, std)`. Fused into the write of each sample (no extra pass).
#[derive(Debug, Clone, PartialEq)]
pub struct Normalize {
    /// Per-channel mean on the 0–1 scale (one value applies to every channel).
    pub mean: Vec<f32>,
    /// Per-channel standard deviation on the 0–1 scale (one value applies to every channel).
    pub std: Vec<f32>,
}

impl Normalize {
    /// ImageNet's RGB statistics: mean `[0.485, 0.456, 0.406]`, std `[0.229, 0.224, 0.225]`.
    pub fn imagenet() -> Normalize {
        Normalize { mean: vec![0.485, 0.456, 0.406], std: vec![0.229, 0.224, 0.225] }
    }

    /// Only scale to `[0, 1]` (mean 0, std 1).
    pub fn unit() -> Normalize {
        Normalize { mean: vec![0.0], std: vec![1.0] }
    }

    fn validate(&self, channels: u8) -> Result<()> {
        let c = usize::from(channels);
        for (what, v) in [("mean", &self.mean), ("std", &self.std)] {
            if v.len() != 1 && v.len() != c {
                return Err(Error::InvalidOptions(format!(
                    "normalize {what} has {} values; the images have {c} channels (give 1 or {c})",
                    v.len()
                )));
            }
            if v.iter().any(|x| !x.is_finite()) {
                return Err(Error::InvalidOptions(format!("normalize {what} {v:?} is not finite")));
            }
        }
        if self.std.contains(&0.0) {
            return Err(Error::InvalidOptions(format!("normalize std {:?} contains 0", self.std)));
        }
        Ok(())
    }
}

/// How to decode a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchOptions {
    /// The transform; it must have a fixed output size (not [`Transform::None`]). Default: resize to 224x224.
    pub transform: Transform,
    /// [`Layout::Nhwc`] (default) or [`Layout::Nchw`].
    pub layout: Layout,
    /// Normalize to `f32` (the batch dtype becomes `F32`); `None` keeps `u8`.
    pub normalize: Option<Normalize>,
    /// `true` (default, as SPDL): any failed item fails the whole call with [`Error::BatchItem`].
    /// `false`: failed slots stay zero and are listed in [`BatchOutput::failures`].
    pub strict: bool,
    /// Decoding threads, the caller's included: `Some(1)` runs everything on the caller's thread (what a
    /// pipeline stage that owns its threads wants); `None` uses the available parallelism.
    pub threads: Option<usize>,
    /// Per-image decode options (pixel format, EXIF orientation, limits, reduced-scale JPEG).
    pub image: ImageOptions,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            transform: Transform::resize(224, 224),
            layout: Layout::Nhwc,
            normalize: None,
            strict: true,
            threads: None,
            image: ImageOptions::default(),
        }
    }
}

/// A decoded batch.
#[derive(Debug)]
pub struct BatchOutput {
    /// `[N, H, W, C]` or `[N, C, H, W]`, `u8` or `f32` (with [`BatchOptions::normalize`]).
    pub buffer: Buffer,
    /// Items that failed, in input order (only in non-strict mode), each an [`Error::BatchItem`] with the
    /// item's position ([`Error::batch_item`]) and name ([`Error::item`]); their slots are zero.
    pub failures: Vec<Error>,
}

/// A batch decoder with validated options and precomputed tables, to be reused for every batch.
///
/// ```
/// use spdl_buffer::system_allocator;
/// use spdl_io::image::{BatchDecoder, BatchOptions, Transform};
///
/// let dec = BatchDecoder::new(
///     BatchOptions { transform: Transform::imagenet_eval(), strict: false, ..BatchOptions::default() },
///     system_allocator(),
/// )?;
/// let items: Vec<(String, Vec<u8>)> = vec![("broken.jpg".into(), b"not an image".to_vec())];
/// let out = dec.decode(&items)?;
/// assert_eq!(out.buffer.shape(), &[1, 224, 224, 3]);
/// assert_eq!(out.failures[0].batch_item().map(|(i, _)| i), Some(0));
/// assert_eq!(out.failures[0].item(), Some("broken.jpg"));
/// assert!(out.buffer.as_bytes().iter().all(|&b| b == 0));
/// # Ok::<(), spdl_io::Error>(())
/// ```
#[derive(Debug)]
pub struct BatchDecoder {
    opts: BatchOptions,
    allocator: SharedAllocator,
    lut: Option<NormalizeLut>,
    width: u32,
    height: u32,
    channels: u8,
}

/// Where the items of a batch come from.
trait Source: Sync {
    fn name(&self, i: usize) -> Cow<'_, str>;
    fn bytes(&self, i: usize) -> Result<Cow<'_, [u8]>>;
}

struct InMemory<'a, N, B>(&'a [(N, B)]);

impl<N: AsRef<str> + Sync, B: AsRef<[u8]> + Sync> Source for InMemory<'_, N, B> {
    fn name(&self, i: usize) -> Cow<'_, str> {
        Cow::Borrowed(self.0.get(i).map_or("", |(n, _)| n.as_ref()))
    }
    fn bytes(&self, i: usize) -> Result<Cow<'_, [u8]>> {
        Ok(Cow::Borrowed(self.0.get(i).map_or(&[][..], |(_, b)| b.as_ref())))
    }
}

struct Files<'a, P>(&'a [P]);

impl<P: AsRef<Path> + Sync> Source for Files<'_, P> {
    fn name(&self, i: usize) -> Cow<'_, str> {
        self.0.get(i).map_or(Cow::Borrowed(""), |p| p.as_ref().to_string_lossy())
    }
    fn bytes(&self, i: usize) -> Result<Cow<'_, [u8]>> {
        let path = self.0.get(i).map_or(Path::new(""), AsRef::as_ref);
        crate::read_file(path, &crate::ReadLimits::default()).map(Cow::Owned)
    }
}

/// Scratch memory of one decoding thread, reused across its items (no allocation per image once warm).
#[derive(Default)]
struct Worker {
    resizer: Resizer,
    decoded: Vec<u8>,
    tmp: Vec<u8>,
    resized: Vec<u8>,
}

/// Scratch above this many bytes is freed after its image rather than kept for the next: one huge image
/// must not hold its decode's memory (outside the decode memory budget) for the rest of the batch.
const KEEP_SCRATCH_BYTES: usize = 64 << 20;

impl Worker {
    fn shed(&mut self) {
        for v in [&mut self.decoded, &mut self.tmp, &mut self.resized] {
            if v.capacity() > KEEP_SCRATCH_BYTES {
                *v = Vec::new();
            }
        }
    }
}

impl BatchDecoder {
    /// Validates `opts` and prepares the decoder; batches are allocated from `allocator`.
    pub fn new(opts: BatchOptions, allocator: SharedAllocator) -> Result<BatchDecoder> {
        opts.image.validate_with(&opts.transform)?;
        let (width, height) = opts.transform.output_size().ok_or_else(|| {
            Error::InvalidOptions("a batch needs a transform with a fixed output size, not Transform::None".into())
        })?;
        if !matches!(opts.layout, Layout::Nhwc | Layout::Nchw) {
            return Err(Error::InvalidOptions(format!("batch layout must be NHWC or NCHW, not {}", opts.layout)));
        }
        if opts.threads == Some(0) {
            return Err(Error::InvalidOptions("threads must be at least 1 (or None for all cores)".into()));
        }
        let channels = opts.image.format.channels();
        let lut = match &opts.normalize {
            Some(n) => {
                n.validate(channels)?;
                Some(NormalizeLut::new(&n.mean, &n.std, channels))
            }
            None => None,
        };
        Ok(BatchDecoder { opts, allocator, lut, width, height, channels })
    }

    /// The options.
    pub fn options(&self) -> &BatchOptions {
        &self.opts
    }

    /// The shape of a batch of `n` items.
    pub fn output_shape(&self, n: usize) -> [usize; 4] {
        let (h, w, c) = (self.height as usize, self.width as usize, usize::from(self.channels));
        match self.opts.layout {
            Layout::Nchw => [n, c, h, w],
            _ => [n, h, w, c],
        }
    }

    /// Decodes `(name, encoded bytes)` items (e.g. `Vec<(String, Vec<u8>)>` or `&[(&str, bytes::Bytes)]`;
    /// the bytes are borrowed, never copied).
    pub fn decode<N, B>(&self, items: &[(N, B)]) -> Result<BatchOutput>
    where
        N: AsRef<str> + Sync,
        B: AsRef<[u8]> + Sync,
    {
        self.run(&InMemory(items), items.len(), None)
    }

    /// Reads and decodes files; each file is read by the thread that decodes it.
    pub fn load<P: AsRef<Path> + Sync>(&self, paths: &[P]) -> Result<BatchOutput> {
        self.run(&Files(paths), paths.len(), None)
    }

    /// [`Self::decode`] with a key per item that seeds its random transform (crop, flip) in place of its
    /// position in the batch: give each sample a stable key (its index in the dataset, mixed with the epoch)
    /// and its crop no longer depends on which batch, or which thread, decodes it.
    ///
    /// ```
    /// # use spdl_buffer::system_allocator;
    /// # use spdl_io::image::{BatchDecoder, BatchOptions, Transform};
    /// # let mut png = Vec::new();
    /// # image::RgbImage::from_fn(64, 48, |x, y| image::Rgb([x as u8 * 4, y as u8 * 5, 9]))
    /// #     .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
    /// let opts = BatchOptions { transform: Transform::imagenet_train(32, 7), ..BatchOptions::default() };
    /// let dec = BatchDecoder::new(opts, system_allocator())?;
    /// // Sample 12 alone, and sample 12 second in a batch: the same crop and flip.
    /// let a = dec.decode_keyed(&[("12.png", &png)], &[12])?;
    /// let b = dec.decode_keyed(&[("3.png", &png), ("12.png", &png)], &[3, 12])?;
    /// assert_eq!(a.buffer.outer_slot(0), b.buffer.outer_slot(1));
    /// # Ok::<(), spdl_io::Error>(())
    /// ```
    pub fn decode_keyed<N, B>(&self, items: &[(N, B)], keys: &[u64]) -> Result<BatchOutput>
    where
        N: AsRef<str> + Sync,
        B: AsRef<[u8]> + Sync,
    {
        Self::check_keys(items.len(), keys)?;
        self.run(&InMemory(items), items.len(), Some(keys))
    }

    /// [`Self::load`] with a key per file (see [`Self::decode_keyed`]).
    pub fn load_keyed<P: AsRef<Path> + Sync>(&self, paths: &[P], keys: &[u64]) -> Result<BatchOutput> {
        Self::check_keys(paths.len(), keys)?;
        self.run(&Files(paths), paths.len(), Some(keys))
    }

    fn check_keys(n: usize, keys: &[u64]) -> Result<()> {
        if keys.len() != n {
            return Err(Error::InvalidOptions(format!("{} keys for {n} items: give one key per item", keys.len())));
        }
        Ok(())
    }

    fn run<S: Source>(&self, src: &S, n: usize, keys: Option<&[u64]>) -> Result<BatchOutput> {
        let dtype = if self.lut.is_some() { DType::F32 } else { DType::U8 };
        let shape = self.output_shape(n);
        let bytes = shape.iter().fold(dtype.size() as u64, |acc, &d| acc.saturating_mul(d as u64));
        crate::decode_memory::check_fits(&format!("a batch of {n} images"), "batch buffer bytes", bytes)?;
        let mut buffer = Buffer::zeros(dtype, &shape, self.opts.layout, &self.allocator)?;
        let slots: Vec<SlotMut<'_>> = match (&self.lut, self.opts.layout) {
            (Some(lut), Layout::Nchw) => {
                buffer.outer_slots_mut_as::<f32>()?.into_iter().map(|s| SlotMut::F32Chw(s, lut)).collect()
            }
            (Some(lut), _) => {
                buffer.outer_slots_mut_as::<f32>()?.into_iter().map(|s| SlotMut::F32Hwc(s, lut)).collect()
            }
            (None, Layout::Nchw) => buffer.outer_slots_mut().into_iter().map(SlotMut::U8Chw).collect(),
            (None, _) => buffer.outer_slots_mut().into_iter().map(SlotMut::U8Hwc).collect(),
        };
        let queue = Mutex::new(slots.into_iter().enumerate());
        let failures = Mutex::new(Vec::new());
        let stop = AtomicBool::new(false);
        let strict = self.opts.strict;

        let work = || {
            let mut worker = Worker::default();
            while !(strict && stop.load(Ordering::Relaxed)) {
                // The lock is held only to take the next slot: threads balance uneven images themselves.
                let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
                let Some((i, mut slot)) = next else { break };
                let name = src.name(i);
                let key = keys.and_then(|k| k.get(i).copied()).unwrap_or(i as u64);
                let result = guarded(&name, "image", || self.process(src, i, key, &name, &mut slot, &mut worker));
                worker.shed();
                if let Err(error) = result {
                    slot.zero();
                    stop.store(true, Ordering::Relaxed);
                    let failure = Error::BatchItem { index: i, source: Box::new(error) };
                    failures.lock().unwrap_or_else(PoisonError::into_inner).push(failure);
                }
            }
        };
        let threads = match self.opts.threads {
            Some(t) => t,
            None => std::thread::available_parallelism().map_or(1, |p| p.get()),
        }
        .min(n)
        .max(1);
        if threads == 1 {
            work();
        } else {
            std::thread::scope(|s| {
                for _ in 1..threads {
                    s.spawn(work);
                }
                work();
            });
        }

        let mut failures = failures.into_inner().unwrap_or_else(PoisonError::into_inner);
        failures.sort_by_key(|f| f.batch_item().map_or(usize::MAX, |(i, _)| i));
        if strict && !failures.is_empty() {
            return Err(failures.swap_remove(0));
        }
        Ok(BatchOutput { buffer, failures })
    }

    /// Decodes item `i` and writes it into `slot`: the resampler writes into the slot itself (NHWC u8) or
    /// into a per-thread scratch image that the fused transpose/normalize pass writes into the slot.
    fn process<S: Source>(
        &self,
        src: &S,
        i: usize,
        key: u64,
        name: &str,
        slot: &mut SlotMut<'_>,
        w: &mut Worker,
    ) -> Result<()> {
        let bytes = src.bytes(i)?;
        let opts = &self.opts;
        let d = decode::decode(&bytes, name, &opts.image, &opts.transform, key, &mut w.decoded, &mut w.tmp)?;
        let plan = d.plan.ok_or_else(|| Error::InvalidOptions(format!("{name}: transform has no plan")))?;
        let pixels =
            Pixels { data: std::mem::take(&mut w.decoded), width: d.width, height: d.height, channels: d.channels };
        let filter = opts.transform.filter();
        let result = if let Some(dst) = slot.direct() {
            resize_into(&mut w.resizer, &pixels, &plan, filter, dst, name)
        } else if plan.is_identity(pixels.width, pixels.height) {
            slot.write(&pixels.data, pixels.channels);
            Ok(())
        } else {
            byte_len(plan.out_w, plan.out_h, pixels.channels)
                .and_then(|len| sized(&mut w.resized, len))
                .and_then(|out| resize_into(&mut w.resizer, &pixels, &plan, filter, out, name))
                .map(|()| slot.write(&w.resized, pixels.channels))
        };
        w.decoded = pixels.data; // keep the allocation for the next item
        result
    }
}

/// Decodes a batch of in-memory images with `opts` into one buffer from `allocator`
/// (see [`BatchDecoder::decode`]; build a [`BatchDecoder`] once to reuse it).
pub fn decode_image_batch<N, B>(
    items: &[(N, B)],
    opts: &BatchOptions,
    allocator: &SharedAllocator,
) -> Result<BatchOutput>
where
    N: AsRef<str> + Sync,
    B: AsRef<[u8]> + Sync,
{
    BatchDecoder::new(opts.clone(), allocator.clone())?.decode(items)
}

/// Reads and decodes a batch of image files (see [`BatchDecoder::load`]).
pub fn load_image_batch<P: AsRef<Path> + Sync>(
    paths: &[P],
    opts: &BatchOptions,
    allocator: &SharedAllocator,
) -> Result<BatchOutput> {
    BatchDecoder::new(opts.clone(), allocator.clone())?.load(paths)
}
