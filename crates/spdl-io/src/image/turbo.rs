//! JPEG through libjpeg-turbo 3's TurboJPEG API: only the region a transform keeps is decoded, at the largest
//! DCT-domain reduction (1/2, 1/4) that keeps the region at least twice the output.
//!
//! Rows above the region are skipped without inverse transforms (`jpeg_skip_scanlines`), rows below it are
//! never entropy-decoded, and blocks left and right of it are never inverse-transformed, upsampled or
//! color-converted (`jpeg_crop_scanline`). The region is widened to the scaled iMCU grid on the left (the
//! API's rule) and by the resampling filter's reach on every side, then the transform's plan is moved onto
//! it, so the output equals a full decode followed by the same crop and resize up to JPEG rounding.
//!
//! One decompressor per thread is kept (creating one allocates its tables). What this path does not take
//! (CMYK/YCCK, 12/16-bit, a header it cannot parse) goes back to the pure-Rust decoder; an EXIF-oriented image
//! is decoded whole (at the plan's reduction) and then rotated.

use std::cell::RefCell;
use std::ffi::CStr;

use image::metadata::Orientation;
use turbojpeg_sys as tj;

use crate::image::admit::{
    Decoded, Issue, admit, check_jpeg_work, check_size, decode_error, exif_orientation, jpeg_is_complete,
    reduction_factor,
};
use crate::image::format::ImageFormat;
use crate::image::pixels::{PixelStore, byte_len, oriented_dims, remap, sized};
use crate::image::transform::{Plan, Transform};
use crate::image::{ImageOptions, PixelFormat};
use crate::{Error, Result};

/// Progressive scans decoded at most: a hostile progressive JPEG can hold thousands of tiny scans, each a
/// full pass over the coefficients. Real encoders write about 10.
const SCAN_LIMIT: i32 = 500;

struct Handle(tj::tjhandle);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { tj::tj3Destroy(self.0) }
    }
}

thread_local! {
    static DECOMPRESSOR: RefCell<Option<Handle>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's decompressor; `None` if libjpeg-turbo could not make one.
fn with_handle<T>(f: impl FnOnce(tj::tjhandle) -> T) -> Option<T> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            // SAFETY: plain constructor; a null result is checked.
            let h = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as i32) };
            if h.is_null() {
                return None;
            }
            // SAFETY: a valid handle; parameters in range.
            unsafe {
                tj::tj3Set(h, tj::TJPARAM_TJPARAM_STOPONWARNING as i32, 0);
                tj::tj3Set(h, tj::TJPARAM_TJPARAM_SCANLIMIT as i32, SCAN_LIMIT);
            }
            *slot = Some(Handle(h));
        }
        slot.as_ref().map(|h| f(h.0))
    })
}

fn error_string(h: tj::tjhandle) -> String {
    // SAFETY: tj3GetErrorStr returns a NUL-terminated static or per-handle string.
    let p = unsafe { tj::tj3GetErrorStr(h) };
    if p.is_null() {
        return "unknown libjpeg-turbo error".into();
    }
    // SAFETY: non-null, NUL-terminated.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The iMCU width of a subsampling (TurboJPEG's `tjMCUWidth`), `None` if unknown.
fn mcu_width(subsamp: i32) -> Option<u32> {
    match subsamp {
        x if x == tj::TJSAMP_TJSAMP_444 || x == tj::TJSAMP_TJSAMP_GRAY => Some(8),
        x if x == tj::TJSAMP_TJSAMP_440 || x == tj::TJSAMP_TJSAMP_441 => Some(8),
        x if x == tj::TJSAMP_TJSAMP_422 || x == tj::TJSAMP_TJSAMP_420 => Some(16),
        x if x == tj::TJSAMP_TJSAMP_411 => Some(32),
        _ => None,
    }
}

/// `ceil(dim / denom)`: TurboJPEG's `TJSCALED` for a 1/denom factor.
fn scaled(dim: u32, denom: u32) -> u32 {
    dim.div_ceil(denom)
}

/// A rectangle of the scaled image: left, top, width, height.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Region {
    pub(crate) x: u32,
    pub(crate) y: u32,
    pub(crate) w: u32,
    pub(crate) h: u32,
}

/// The region of the 1/`denom`-scaled image (`sw` x `sh`) to decode for `plan` (in full-size coordinates of
/// a `w` x `h` image), and the plan moved onto that region. `imcu` is the scaled iMCU width the left edge
/// must align to.
pub(crate) fn region_for(plan: &Plan, (w, h): (u32, u32), denom: u32, imcu: u32) -> (Region, Plan) {
    let (sw, sh) = (scaled(w, denom), scaled(h, denom));
    let sx = f64::from(sw) / f64::from(w);
    let sy = f64::from(sh) / f64::from(h);
    let (left, top) = (plan.left * sx, plan.top * sy);
    let (cw, ch) = (plan.width * sx, plan.height * sy);
    // The resampling filter reaches up to ~3 output pixels (Lanczos3) beyond each output pixel: that many
    // source pixels per output pixel of shrink, plus one for rounding.
    let reach = |crop: f64, out: u32| (3.0 * (crop / f64::from(out)).max(1.0)).ceil() + 1.0;
    let (mx, my) = (reach(cw, plan.out_w), reach(ch, plan.out_h));
    let x0 = (left - mx).floor().max(0.0) as u32;
    let x0 = x0 - x0 % imcu.max(1);
    let y0 = (top - my).floor().max(0.0) as u32;
    let x1 = ((left + cw + mx).ceil() as u32).min(sw).max(x0 + 1);
    let y1 = ((top + ch + my).ceil() as u32).min(sh).max(y0 + 1);
    let region = Region { x: x0, y: y0, w: x1 - x0, h: y1 - y0 };
    let (l, t) = (left - f64::from(x0), top - f64::from(y0));
    let moved = Plan {
        left: l,
        top: t,
        width: cw.min(f64::from(region.w) - l),
        height: ch.min(f64::from(region.h) - t),
        ..*plan
    };
    (region, moved)
}

/// Decodes a JPEG with libjpeg-turbo, reading only what `transform` keeps. `Ok(None)`: this path does not
/// take the image (see the module doc); the caller decodes it another way.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_jpeg<S: PixelStore>(
    bytes: &[u8],
    item: &str,
    opts: &ImageOptions,
    transform: &Transform,
    salt: u64,
    store: &mut S,
    tmp: &mut Vec<u8>,
) -> Result<Option<Decoded>> {
    let orientation =
        if opts.exif_orientation { exif_orientation(exif_chunk(bytes)) } else { Orientation::NoTransforms };
    let result = with_handle(|h| decode_with(h, bytes, item, opts, transform, salt, orientation, store, tmp))
        .unwrap_or(Ok(None));
    if !matches!(result, Ok(Some(_))) {
        // A failed header or decode can leave the decompressor mid-image; the next image gets a fresh one
        // (errors are rare, and a new decompressor costs microseconds).
        DECOMPRESSOR.with(|cell| cell.borrow_mut().take());
    }
    result
}

/// The EXIF payload (after `Exif\0\0`) of a JPEG's APP1 segment, found by walking the header segments.
fn exif_chunk(b: &[u8]) -> Option<&[u8]> {
    if b.get(0..2) != Some(&[0xFF, 0xD8][..]) {
        return None;
    }
    let mut i = 2usize;
    loop {
        while b.get(i) == Some(&0xFF) && b.get(i + 1) == Some(&0xFF) {
            i += 1; // fill bytes
        }
        let (&m0, &m) = (b.get(i)?, b.get(i + 1)?);
        if m0 != 0xFF || m == 0xDA || m == 0xD9 {
            return None; // not a marker, or the headers are over
        }
        let len = usize::from(u16::from_be_bytes([*b.get(i + 2)?, *b.get(i + 3)?]));
        let seg = b.get(i + 4..(i + 2).checked_add(len)?)?;
        if m == 0xE1 && seg.starts_with(b"Exif\0\0") {
            return seg.get(6..);
        }
        i += 2 + len.max(2);
    }
}

#[allow(clippy::too_many_arguments)]
fn decode_with<S: PixelStore>(
    h: tj::tjhandle,
    bytes: &[u8],
    item: &str,
    opts: &ImageOptions,
    transform: &Transform,
    salt: u64,
    orientation: Orientation,
    store: &mut S,
    tmp: &mut Vec<u8>,
) -> Result<Option<Decoded>> {
    const F: ImageFormat = ImageFormat::Jpeg;
    // SAFETY: `bytes` is valid for its length; the handle is this thread's.
    if unsafe { tj::tj3DecompressHeader(h, bytes.as_ptr(), bytes.len() as tj::size_t) } != 0 {
        return Ok(None);
    }
    // SAFETY: a valid handle after a successful header read.
    let get = |p: tj::TJPARAM| unsafe { tj::tj3Get(h, p as i32) };
    let (w, hgt) = (get(tj::TJPARAM_TJPARAM_JPEGWIDTH), get(tj::TJPARAM_TJPARAM_JPEGHEIGHT));
    let colorspace = get(tj::TJPARAM_TJPARAM_COLORSPACE);
    if get(tj::TJPARAM_TJPARAM_PRECISION) != 8
        || colorspace == tj::TJCS_TJCS_CMYK as i32
        || colorspace == tj::TJCS_TJCS_YCCK as i32
    {
        return Ok(None);
    }
    let (Ok(w), Ok(hgt)) = (u32::try_from(w), u32::try_from(hgt)) else { return Ok(None) };
    check_size(item, F, w, hgt, opts.max_pixels)?;
    // libjpeg-turbo's scan limit bounds the count, not the work: 500 scans of 8192 x 8192 is 33 G
    // pixel-passes.
    check_jpeg_work(bytes, item, w, hgt, opts.max_scan_pixels)?;
    if !opts.allow_truncated && !jpeg_is_complete(bytes) {
        return Err(decode_error(item, F, Issue::Truncated));
    }
    let cout = opts.format.channels();
    let (ow, oh) = oriented_dims(orientation, w, hgt);
    let plan = transform.plan(ow, oh, salt);
    let reservation = admit(item, (w, hgt), 2 * u64::from(cout), cout, plan.as_ref(), opts.max_pixels)?;
    let denom = match &plan {
        Some(p) if opts.reduced_scale_jpeg => reduction_factor(p),
        _ => 1,
    };
    if orientation != Orientation::NoTransforms {
        // Rare in training data (EXIF orientation is off by default): the whole image, then rotated.
        return decode_oriented(h, bytes, item, opts, (w, hgt), denom, orientation, plan, store, tmp).map(
            |(width, height, plan)| Some(Decoded { width, height, channels: cout, plan, _reservation: reservation }),
        );
    }

    let imcu = mcu_width(get(tj::TJPARAM_TJPARAM_SUBSAMP)).map(|m| scaled(m, denom));
    let (sw, sh) = (scaled(w, denom), scaled(hgt, denom));
    let (region, plan) = match (&plan, imcu) {
        (Some(p), Some(imcu)) => {
            let (r, moved) = region_for(p, (w, hgt), denom, imcu);
            (r, Some(moved))
        }
        // No plan (the whole image) or an unusual subsampling (no cropping): the whole scaled image.
        (p, _) => {
            let whole = Region { x: 0, y: 0, w: sw, h: sh };
            let sx = f64::from(sw) / f64::from(w);
            let sy = f64::from(sh) / f64::from(hgt);
            (whole, p.map(|p| p.scaled(sx, sy, sw, sh)))
        }
    };
    let cropped = region != Region { x: 0, y: 0, w: sw, h: sh };
    set_scale_and_region(h, item, denom, cropped.then_some(region))?;
    let out = store.slice(region.w, region.h, cout)?;
    decompress(h, bytes, item, out, region.w, region.h, opts.format)?;
    Ok(Some(Decoded { width: region.w, height: region.h, channels: cout, plan, _reservation: reservation }))
}

/// Sets the 1/`denom` scale and the region of the scaled image to decode (`None`: all of it) on `h`, after its
/// header was read. The region must lie in the scaled image with its left edge on the scaled iMCU grid.
fn set_scale_and_region(h: tj::tjhandle, item: &str, denom: u32, region: Option<Region>) -> Result<()> {
    let sf = tj::tjscalingfactor { num: 1, denom: denom as i32 };
    let crop = match region {
        Some(r) => tj::tjregion { x: r.x as i32, y: r.y as i32, w: r.w as i32, h: r.h as i32 },
        None => tj::tjregion { x: 0, y: 0, w: 0, h: 0 },
    };
    // SAFETY: a valid handle after the header; 1/1, 1/2 and 1/4 are factors TurboJPEG supports, and the
    // caller places the region as TurboJPEG requires.
    if unsafe { tj::tj3SetScalingFactor(h, sf) != 0 || tj::tj3SetCroppingRegion(h, crop) != 0 } {
        return Err(decode_error(item, ImageFormat::Jpeg, error_string(h)));
    }
    Ok(())
}

/// Runs the decompression set up on `h` into `out` (`w` x `h` pixels of `format`).
fn decompress(
    h: tj::tjhandle,
    bytes: &[u8],
    item: &str,
    out: &mut [u8],
    width: u32,
    height: u32,
    format: PixelFormat,
) -> Result<()> {
    let pf = match format {
        PixelFormat::Rgb8 => tj::TJPF_TJPF_RGB,
        PixelFormat::Rgba8 => tj::TJPF_TJPF_RGBA,
        PixelFormat::Gray8 => tj::TJPF_TJPF_GRAY,
    };
    let pitch = (width as usize) * usize::from(format.channels());
    if out.len() < pitch * height as usize {
        return Err(Error::InvalidOptions(format!("{item}: output slot too small for {width}x{height}")));
    }
    let len = bytes.len() as tj::size_t;
    // SAFETY: `out` holds `height` rows of `pitch` bytes, which is what TurboJPEG writes for the region,
    // scale and pixel format set on `h`.
    let rc = unsafe { tj::tj3Decompress8(h, bytes.as_ptr(), len, out.as_mut_ptr(), pitch as i32, pf) };
    // SAFETY: a valid handle.
    if rc != 0 && unsafe { tj::tj3GetErrorCode(h) } != tj::TJERR_TJERR_WARNING as i32 {
        // Warnings (corrupt entropy data, as libjpeg and browsers) decode what is there; errors fail.
        return Err(decode_error(item, ImageFormat::Jpeg, error_string(h)));
    }
    Ok(())
}

/// The whole image at 1/`denom` scale, rotated/flipped into `store` as `orientation` says; returns the
/// oriented size and the plan scaled onto it.
#[allow(clippy::too_many_arguments)]
fn decode_oriented<S: PixelStore>(
    h: tj::tjhandle,
    bytes: &[u8],
    item: &str,
    opts: &ImageOptions,
    (w, hgt): (u32, u32),
    denom: u32,
    orientation: Orientation,
    plan: Option<Plan>,
    store: &mut S,
    tmp: &mut Vec<u8>,
) -> Result<(u32, u32, Option<Plan>)> {
    set_scale_and_region(h, item, denom, None)?;
    let (sw, sh) = (scaled(w, denom), scaled(hgt, denom));
    let cout = opts.format.channels();
    let t = sized(tmp, byte_len(sw, sh, cout)?)?;
    decompress(h, bytes, item, t, sw, sh, opts.format)?;
    let (ow, oh) = oriented_dims(orientation, sw, sh);
    let out = store.slice(ow, oh, cout)?;
    remap(t, sw, sh, cout, orientation, out, cout);
    let (full_w, full_h) = oriented_dims(orientation, w, hgt);
    let plan = plan.map(|p| p.scaled(f64::from(ow) / f64::from(full_w), f64::from(oh) / f64::from(full_h), ow, oh));
    Ok((ow, oh, plan))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_is_aligned_and_covers_the_crop() {
        let plan = Plan { left: 100.0, top: 50.0, width: 300.0, height: 200.0, out_w: 224, out_h: 224, flip: false };
        let (r, moved) = region_for(&plan, (640, 480), 1, 16);
        assert_eq!(r.x % 16, 0);
        assert!(r.x as f64 <= 100.0 && r.y as f64 <= 50.0);
        assert!(f64::from(r.x + r.w) >= 400.0 && f64::from(r.y + r.h) >= 250.0);
        assert_eq!((moved.left + f64::from(r.x), moved.top + f64::from(r.y)), (100.0, 50.0));
        assert_eq!((moved.width, moved.height), (300.0, 200.0));
        // Half scale: coordinates halve, the grid is 8.
        let big = Plan { left: 1000.0, top: 800.0, width: 2000.0, height: 1600.0, out_w: 224, out_h: 224, flip: false };
        let (r, moved) = region_for(&big, (4000, 3000), 2, 8);
        assert_eq!(r.x % 8, 0);
        assert!(r.x <= 500 && r.x + r.w >= 1500 && r.y <= 400 && r.y + r.h >= 1200);
        assert!((moved.left + f64::from(r.x) - 500.0).abs() < 1e-9 && (moved.width - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn exif_chunk_is_found_and_garbage_is_not() {
        assert_eq!(exif_chunk(b"\xFF\xD8\xFF\xE1\x00\x0cExif\x00\x00II*\x00\xFF\xDA"), Some(&b"II*\x00"[..]));
        assert_eq!(exif_chunk(b"\xFF\xD8\xFF\xE1\xFF\xFF"), None);
        assert_eq!(exif_chunk(b"\xFF\xD8\xFF\xE1\x00\x00\x00"), None);
        assert_eq!(exif_chunk(b""), None);
    }
}
