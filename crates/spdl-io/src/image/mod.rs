//! Image decoding, transforms and batch decoding into [`spdl_buffer::Buffer`]s.
//!
//! Start from [`decode_image_batch`] (or a reusable [`BatchDecoder`]): N encoded images in, one contiguous
//! `[N, H, W, C]` (or `[N, C, H, W]`, optionally normalized `f32`) buffer out, from any
//! [`spdl_buffer::HostAllocator`]. Images decode in parallel on scoped threads (or entirely on the
//! caller's thread with `threads: Some(1)`), and each image's final resize/crop/normalize pass writes
//! straight into its slot of the batch: nothing is copied into the batch afterwards.
//!
//! Single images: [`decode_image`] / [`load_image`] give an HWC `u8` buffer; [`image_info`] reads the
//! header only.
//!
//! Formats: JPEG (baseline, progressive), PNG (8/16-bit, palette, alpha), WebP, GIF (first frame), BMP,
//! TIFF, recognised from their magic bytes, never the file name. Output is RGB8, RGBA8 or Gray8
//! ([`PixelFormat`]); EXIF orientation is applied on request. Hostile input (corrupt, truncated, empty,
//! decompression bombs) gives a typed [`crate::Error`] naming the item; the pixel limit is checked from the
//! header before anything is allocated, and decoder panics are caught and reported as errors.
//!
//! JPEGs that a transform shrinks at least 4x are decoded at a reduced scale in the DCT domain (1/2 or
//! 1/4, as libjpeg-turbo and Pillow's `draft` do), which skips most of the IDCT, upsampling and color
//! conversion; see [`ImageOptions::reduced_scale_jpeg`]. ImageNet-size images resized to 224 are not
//! shrunk enough for it and always take the full decode.
//!
//! # Example
//! ```
//! use spdl_buffer::{DType, Layout, system_allocator};
//! use spdl_io::image::{BatchOptions, Normalize, Transform, decode_image_batch};
//!
//! // Two tiny images made on the spot (a real loader passes file contents).
//! let encode = |w, h| {
//!     let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 128]));
//!     let mut png = Vec::new();
//!     img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
//!     png
//! };
//! let items = vec![("a.png".to_string(), encode(64, 48)), ("b.png".to_string(), encode(40, 80))];
//!
//! let opts = BatchOptions {
//!     transform: Transform::resize(32, 32),
//!     layout: Layout::Nchw,
//!     normalize: Some(Normalize::imagenet()),
//!     threads: Some(1),
//!     ..BatchOptions::default()
//! };
//! let out = decode_image_batch(&items, &opts, &system_allocator())?;
//! assert_eq!(out.buffer.shape(), &[2, 3, 32, 32]);
//! assert_eq!(out.buffer.dtype(), DType::F32);
//! assert!(out.failures.is_empty());
//! # Ok::<(), spdl_io::Error>(())
//! ```

mod admit;
mod batch;
mod decode;
mod encode;
mod format;
mod pixels;
pub(crate) mod rng;
mod transform;
#[cfg(feature = "turbojpeg")]
mod turbo;

use std::path::Path;

use fast_image_resize::Resizer;
use spdl_buffer::{Buffer, DType, Layout, SharedAllocator};

/// The JPEG decoder of this build: `"libjpeg-turbo 3.1.0"` (feature `turbojpeg`, linked in statically) or
/// `"zune-jpeg"` (pure Rust).
///
/// ```
/// assert!(spdl_io::image::jpeg_decoder().contains("jpeg"));
/// ```
pub fn jpeg_decoder() -> String {
    let turbo = env!("SPDL_IO_TURBOJPEG_VERSION");
    if cfg!(feature = "turbojpeg") && !turbo.is_empty() {
        format!("{JPEG_DECODER} {turbo}")
    } else {
        JPEG_DECODER.into()
    }
}

pub use batch::{BatchDecoder, BatchOptions, BatchOutput, Normalize, decode_image_batch, load_image_batch};
pub use encode::{EncodeColor, EncodeOptions, encode_image};
pub use format::ImageFormat;
pub use transform::{ResizeFilter, Transform, TransformName, UnknownTransform};

use crate::{Error, Result};
use pixels::{BufferStore, Pixels, resize_into};

/// The JPEG decoder of this build: `"libjpeg-turbo"` (feature `turbojpeg`: region and DCT-scaled decodes) or
/// `"zune-jpeg"` (pure Rust, full decodes; also the fallback for what libjpeg-turbo does not take).
pub const JPEG_DECODER: &str = if cfg!(feature = "turbojpeg") { "libjpeg-turbo" } else { "zune-jpeg" };

/// Pillow's decompression-bomb error threshold (2 x `Image.MAX_IMAGE_PIXELS`), the default pixel limit.
pub const DEFAULT_MAX_PIXELS: u64 = 178_956_970;

/// The default [`ImageOptions::max_metadata_bytes`]: 16 MiB (real ICC profiles are under 1 MB), the size
/// below which a decode's working memory is not metered by the process-wide decode memory budget.
pub const DEFAULT_MAX_METADATA_BYTES: u64 = crate::decode_memory::UNMETERED_BYTES;

/// The default [`ImageOptions::max_scan_pixels`]: 2^32, 24 full passes over an image of
/// [`DEFAULT_MAX_PIXELS`]; real progressive encoders write about 10 scans. About 4 s of zune-jpeg decode
/// at the limit (a pass over the coefficients costs about 1 ns a pixel).
pub const DEFAULT_MAX_SCAN_PIXELS: u64 = 1 << 32;

/// The pixel format of decoded images (always 8 bits per channel, interleaved). Video frames have their
/// own, `spdl_io::video::FramePixelFormat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum PixelFormat {
    /// Red, green, blue. Alpha, if any, is dropped (not composited), as Pillow's `convert("RGB")`.
    #[default]
    Rgb8,
    /// Red, green, blue, alpha (opaque images get 255).
    Rgba8,
    /// ITU-R BT.601 luma (JPEG's Y channel, Pillow's `convert("L")`).
    Gray8,
}

impl PixelFormat {
    /// Channels per pixel: 3, 4 or 1.
    pub const fn channels(self) -> u8 {
        match self {
            PixelFormat::Rgb8 => 3,
            PixelFormat::Rgba8 => 4,
            PixelFormat::Gray8 => 1,
        }
    }
}

/// How to decode one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageOptions {
    /// Output pixel format (default RGB8).
    pub format: PixelFormat,
    /// Rotate/flip as the EXIF orientation tag says (JPEG, PNG, WebP, TIFF). Default `false`, as Pillow,
    /// torchvision's `decode_jpeg` and SPDL.
    pub exif_orientation: bool,
    /// Refuse images with more pixels than this (decompression bombs), checked from the header before
    /// anything is allocated. Default [`DEFAULT_MAX_PIXELS`].
    pub max_pixels: u64,
    /// Decode JPEGs at 1/2 or 1/4 scale in the DCT domain (jpeg-decoder's scaled IDCT) when the decoded
    /// crop stays at least twice the output size (Pillow's `reducing_gap=2`), i.e. for shrinks of 4x or
    /// more; the final antialiased resize does the rest. Default `true`: measured 1.3–2.4x faster decode +
    /// resize where it applies, 44–54 dB PSNR from the full decode's output (docs/benchmarks.md). It never
    /// applies to [`Transform::None`] nor to ImageNet-size images resized to 224.
    pub reduced_scale_jpeg: bool,
    /// Decode JPEGs that end before their end-of-image marker (the missing part is gray). Default `false`:
    /// a truncated file is an error, so a half-downloaded image never reaches training silently.
    pub allow_truncated: bool,
    /// What a decoder may allocate for itself beyond 16 bytes per declared pixel: its copy of the header and
    /// of metadata (an ICC profile, EXIF, text chunks) and its chunk buffers. A 1 MB PNG of 16 x 16 pixels
    /// whose compressed iCCP profile inflates to 500 MB was given the whole 1.5 GB pixel allowance and
    /// peaked at 1.1–1.5 GB; it is now refused (`Decode`: "the decoder's own allocations ..."). Default
    /// [`DEFAULT_MAX_METADATA_BYTES`].
    pub max_metadata_bytes: u64,
    /// The decode work of a JPEG, width x height x scans, checked from its markers before decoding: each
    /// scan of a progressive JPEG is a pass over every coefficient, so a 312 KB 8192 x 8192 JPEG of 500
    /// tiny scans took 26–32 s. Over it: `LimitExceeded: JPEG decode work (pixels x scans)`. Default
    /// [`DEFAULT_MAX_SCAN_PIXELS`].
    pub max_scan_pixels: u64,
}

impl Default for ImageOptions {
    fn default() -> Self {
        ImageOptions {
            format: PixelFormat::Rgb8,
            exif_orientation: false,
            max_pixels: DEFAULT_MAX_PIXELS,
            reduced_scale_jpeg: true,
            allow_truncated: false,
            max_metadata_bytes: DEFAULT_MAX_METADATA_BYTES,
            max_scan_pixels: DEFAULT_MAX_SCAN_PIXELS,
        }
    }
}

impl ImageOptions {
    /// Checks the options.
    pub fn validate(&self) -> Result<()> {
        if self.max_pixels == 0 {
            return Err(Error::InvalidOptions("max_pixels must be at least 1".into()));
        }
        if self.max_scan_pixels == 0 {
            return Err(Error::InvalidOptions("max_scan_pixels must be at least 1".into()));
        }
        Ok(())
    }

    /// Checks these options with `transform`: the transform's output is held to the same pixel limit as
    /// the images themselves (an output of 65535 x 65535 from a thumbnail is refused here, before any
    /// decode).
    pub fn validate_with(&self, transform: &Transform) -> Result<()> {
        self.validate()?;
        transform.validate()?;
        if let Some((w, h)) = transform.output_size() {
            let pixels = u64::from(w) * u64::from(h);
            if pixels > self.max_pixels {
                return Err(Error::InvalidOptions(format!(
                    "the transform's output {w}x{h} is {pixels} pixels, above max_pixels {}",
                    self.max_pixels
                )));
            }
        }
        Ok(())
    }
}

/// What the header says about an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImageInfo {
    /// The container format (from the magic bytes).
    pub format: ImageFormat,
    /// Width in pixels, as stored (before any EXIF orientation).
    pub width: u32,
    /// Height in pixels, as stored.
    pub height: u32,
}

/// Reads format and size from the header of `bytes` without decoding pixels. `name` is used in errors.
///
/// ```
/// use spdl_io::image::{ImageFormat, image_info};
/// let mut png = Vec::new();
/// image::RgbImage::new(7, 5).write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
/// let info = image_info(&png, "x.png")?;
/// assert_eq!((info.format, info.width, info.height), (ImageFormat::Png, 7, 5));
/// assert!(image_info(b"", "empty.jpg").is_err());
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub fn image_info(bytes: &[u8], name: &str) -> Result<ImageInfo> {
    let (format, width, height) = decode::probe(bytes, name)?;
    Ok(ImageInfo { format, width, height })
}

/// Decodes one image into an HWC `u8` buffer from `allocator`, applying `transform`.
///
/// `name` identifies the item in errors (a path, a key). With [`Transform::None`] the decoder writes
/// straight into the returned buffer.
///
/// ```
/// use spdl_buffer::{Layout, system_allocator};
/// use spdl_io::image::{ImageOptions, PixelFormat, Transform, decode_image};
///
/// let mut png = Vec::new();
/// image::RgbImage::from_pixel(40, 30, image::Rgb([200, 100, 50]))
///     .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
///     .unwrap();
/// let opts = ImageOptions { format: PixelFormat::Gray8, ..ImageOptions::default() };
/// let buf = decode_image(&png, "x.png", &opts, &Transform::resize(20, 15), &system_allocator())?;
/// assert_eq!((buf.shape(), buf.layout()), (&[15, 20, 1][..], Layout::Hwc));
/// assert_eq!(buf.as_bytes()[0], 124); // 0.299 R + 0.587 G + 0.114 B
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub fn decode_image(
    bytes: &[u8],
    name: &str,
    opts: &ImageOptions,
    transform: &Transform,
    allocator: &SharedAllocator,
) -> Result<Buffer> {
    opts.validate_with(transform)?;
    let mut tmp = Vec::new();
    if transform.output_size().is_none() {
        let mut store = BufferStore { allocator, buffer: None };
        decode::decode(bytes, name, opts, transform, 0, &mut store, &mut tmp)?;
        return store.buffer.ok_or_else(|| Error::InvalidOptions(format!("{name}: the decoder produced no image")));
    }
    let mut data = Vec::new();
    let d = decode::decode(bytes, name, opts, transform, 0, &mut data, &mut tmp)?;
    let pixels = Pixels { data, width: d.width, height: d.height, channels: d.channels };
    let plan = d.plan.ok_or_else(|| Error::InvalidOptions(format!("{name}: transform {transform:?} has no plan")))?;
    let shape = [plan.out_h as usize, plan.out_w as usize, usize::from(d.channels)];
    let mut buf = Buffer::zeros(DType::U8, &shape, Layout::Hwc, allocator)?;
    crate::error::guarded(name, "resize", || {
        resize_into(&mut Resizer::new(), &pixels, &plan, transform.filter(), buf.as_bytes_mut(), name)
    })?;
    Ok(buf)
}

/// Reads and decodes the file at `path` (see [`decode_image`]); errors name the path. The path must be a
/// regular file of at most [`crate::DEFAULT_MAX_FILE_BYTES`] (see [`crate::read_file`]; to decode anything
/// else, read it with `read_file` and an opt-in, then call [`decode_image`]).
pub fn load_image(
    path: impl AsRef<Path>,
    opts: &ImageOptions,
    transform: &Transform,
    allocator: &SharedAllocator,
) -> Result<Buffer> {
    let path = path.as_ref();
    let bytes = crate::read_file(path, &crate::ReadLimits::default())?;
    decode_image(&bytes, &path.display().to_string(), opts, transform, allocator)
}
