//! What every image decoder shares (the pure-Rust ones in `decode` and libjpeg-turbo in `turbo`): the checks
//! made from the header before any pixel is decoded (size, JPEG decode work, truncation), the reservation of
//! the decode's working memory, the reduced-scale choice, and what a decode produced ([`Decoded`]). Both
//! decoders import this module; neither imports the other's helpers.

use image::metadata::Orientation;

use crate::decode_memory::{self, Reservation};
use crate::image::format::ImageFormat;
use crate::image::transform::Plan;
use crate::{Error, Result};

/// Reduced-scale JPEG decoding is used only when the decoded crop stays at least this many times larger
/// than the output, so that the final antialiased resize still does real filtering (Pillow's
/// `reducing_gap=2.0`): a 1/2 decode needs a 4x shrink. Measured (tests/image_reduced_scale.rs,
/// docs/benchmarks.md): with 1.0 the result lost 0.6–5.9 dB PSNR against an ideal resize; with 2.0 it is
/// within 0.1–2.5 dB of the full decode's own error and 44–54 dB from the full decode's output.
const REDUCED_SCALE_MIN_GAP: f64 = 2.0;

/// Why a decode failed, when the decoder itself did not say (the `cause` of [`Error::Decode`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Issue {
    #[error(
        "the data ends before the JPEG end-of-image marker (truncated file); \
         ImageOptions::allow_truncated decodes what is there"
    )]
    Truncated,
    #[error("the header declares an empty {0}x{1} image")]
    ZeroSize(u32, u32),
    #[error("the decoder returned {got} bytes for a {width}x{height}x{channels} image")]
    Size { got: usize, width: u32, height: u32, channels: u8 },
    #[error(
        "the decoder's own allocations (metadata such as an ICC profile, EXIF or text chunks, and its \
         buffers) would pass this decode's allowance of {limit} bytes (16 per declared pixel + \
         ImageOptions::max_metadata_bytes)"
    )]
    DecoderMemory { limit: u64 },
}

/// What a decode produced: the pixels (in the store) are `width` x `height` x `channels`, oriented, and
/// `plan` is the transform planned on them (already scaled if the JPEG was decoded at a reduced scale).
/// `reservation` holds the decode's working memory in the process-wide decode memory budget until the caller has
/// resized the pixels.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) channels: u8,
    pub(crate) plan: Option<Plan>,
    pub(crate) _reservation: Reservation,
}

/// The most pixels fast_image_resize's two-pass convolution may hold between its passes: the crop resized
/// along one axis only. A 50,000,000 x 1 image resized to 224 x 224 would hold 11.2 G pixels there, however
/// few pixels it has itself.
pub(crate) fn resize_intermediate_pixels(plan: &Plan) -> u64 {
    let crop_w = plan.width.ceil().max(1.0) as u64;
    let crop_h = plan.height.ceil().max(1.0) as u64;
    (u64::from(plan.out_w) * crop_h).max(crop_w * u64::from(plan.out_h))
}

/// Bounds what decoding a `w` x `h` image (`native` bytes per decoded pixel, including the decoder's own
/// planes) and then running `plan` will cost, before anything is allocated: the resize's intermediate is held
/// to the pixel limit like the image itself (the output already is, by [`ImageOptions::validate_with`]), and
/// the working set is reserved from the process-wide decode memory budget.
pub(crate) fn admit(
    item: &str,
    (w, h): (u32, u32),
    native: u64,
    cout: u8,
    plan: Option<&Plan>,
    max_pixels: u64,
) -> Result<Reservation> {
    let pixels = u64::from(w) * u64::from(h);
    let cout = u64::from(cout);
    let mut bytes = pixels.saturating_mul(native.saturating_add(cout));
    if let Some(plan) = plan {
        let out = u64::from(plan.out_w) * u64::from(plan.out_h);
        let mid = resize_intermediate_pixels(plan);
        if mid > max_pixels {
            return Err(Error::LimitExceeded {
                item: item.to_owned(),
                what: "resize intermediate pixels".into(),
                value: mid,
                limit: max_pixels,
            });
        }
        bytes = bytes.saturating_add(mid.saturating_add(out).saturating_mul(cout));
    }
    decode_memory::reserve(item, bytes)
}

pub(crate) fn decode_error(item: &str, format: ImageFormat, cause: impl Into<crate::error::BoxError>) -> Error {
    Error::Decode { item: item.to_owned(), format: format.name().to_owned(), cause: cause.into() }
}

pub(crate) fn check_size(item: &str, format: ImageFormat, w: u32, h: u32, max_pixels: u64) -> Result<()> {
    if w == 0 || h == 0 {
        return Err(decode_error(item, format, Issue::ZeroSize(w, h)));
    }
    let pixels = u64::from(w) * u64::from(h);
    if pixels > max_pixels {
        return Err(Error::LimitExceeded {
            item: item.to_owned(),
            what: "pixels".into(),
            value: pixels,
            limit: max_pixels,
        });
    }
    Ok(())
}

/// True if the last marker in the file is an end-of-image (EOI) rather than a start-of-scan (SOS):
/// entropy-coded data byte-stuffs 0xFF, so neither marker can occur inside it. Scans from the end, so a
/// complete file costs a few bytes; trailing bytes after the EOI are fine.
pub(crate) fn jpeg_is_complete(bytes: &[u8]) -> bool {
    for w in bytes.windows(2).rev() {
        match w {
            [0xFF, 0xD9] => return true,
            [0xFF, 0xDA] => return false,
            _ => {}
        }
    }
    false
}

/// The scans (start-of-scan markers) of a JPEG, counted by walking its marker segments and skipping over
/// entropy-coded data to the next marker (in which 0xFF is always byte-stuffed); at most `stop`. One pass
/// over the bytes, no decoding.
pub(crate) fn jpeg_scans(b: &[u8], stop: u64) -> u64 {
    let mut scans = 0u64;
    let mut i = 2usize; // after SOI
    while scans < stop {
        // The next 0xFF: a marker, or (in entropy-coded data) stuffing and restart markers, skipped below.
        let Some(off) = b.get(i..).and_then(|rest| rest.iter().position(|&x| x == 0xFF)) else { break };
        i += off;
        let Some(&m) = b.get(i + 1) else { break };
        match m {
            // Stuffed zero, fill byte, restart markers, TEM, SOI: no length.
            0x00 | 0xFF | 0xD0..=0xD7 | 0x01 | 0xD8 => i += if m == 0xFF { 1 } else { 2 },
            0xD9 => break, // end of image
            _ => {
                if m == 0xDA {
                    scans += 1;
                }
                let Some(len) = b.get(i + 2..i + 4).map(|l| usize::from(u16::from_be_bytes([l[0], l[1]]))) else {
                    break;
                };
                i += 2 + len.max(2);
            }
        }
    }
    scans
}

/// Refuses a JPEG whose decode work, pixels x scans, is over `limit` (see
/// [`ImageOptions::max_scan_pixels`]), from its markers, before any decoding.
pub(crate) fn check_jpeg_work(bytes: &[u8], item: &str, w: u32, h: u32, limit: u64) -> Result<()> {
    let pixels = (u64::from(w) * u64::from(h)).max(1);
    // Counting stops at the first scan over the limit.
    let scans = jpeg_scans(bytes, (limit / pixels).saturating_add(1));
    let work = pixels.saturating_mul(scans);
    if work > limit {
        return Err(Error::LimitExceeded {
            item: item.to_owned(),
            what: format!("JPEG decode work (pixels x scans: {w}x{h} x at least {scans} scans)"),
            value: work,
            limit,
        });
    }
    Ok(())
}

pub(crate) fn exif_orientation(chunk: Option<&[u8]>) -> Orientation {
    chunk.and_then(Orientation::from_exif_chunk).unwrap_or(Orientation::NoTransforms)
}

/// The DCT reduction (4, 2 or 1) that keeps the decoded crop at least [`REDUCED_SCALE_MIN_GAP`] times the
/// output. 1/8 (DC only, an 8x8 box average) is never used: it lost 12 dB where 1/4 lost 2.5.
pub(crate) fn reduction_factor(plan: &Plan) -> u32 {
    let shrink = plan.shrink();
    [4u32, 2].into_iter().find(|&f| shrink >= f64::from(f) * REDUCED_SCALE_MIN_GAP).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eoi_detection() {
        assert!(jpeg_is_complete(&[0xFF, 0xD8, 0xFF, 0xDA, 1, 2, 0xFF, 0x00, 0xFF, 0xD9]));
        assert!(jpeg_is_complete(&[0xFF, 0xDA, 1, 0xFF, 0xD9, 0, 0, 0])); // trailing padding
        assert!(!jpeg_is_complete(&[0xFF, 0xD8, 0xFF, 0xDA, 1, 2, 0xFF, 0x00]));
        assert!(!jpeg_is_complete(&[]));
    }

    #[test]
    fn scans_are_counted_over_entropy_data() {
        // SOI, SOS + data with a stuffed 0xFF and a restart marker, SOS, EOI, and a third SOS after the EOI.
        let b =
            [0xFF, 0xD8, 0xFF, 0xDA, 0, 2, 1, 0xFF, 0x00, 0xFF, 0xD0, 2, 0xFF, 0xDA, 0, 3, 0, 0xFF, 0xD9, 0xFF, 0xDA];
        assert_eq!(jpeg_scans(&b, u64::MAX), 2);
        assert_eq!(jpeg_scans(&b, 1), 1);
        assert_eq!(jpeg_scans(&b[..5], u64::MAX), 1);
        assert_eq!(jpeg_scans(&[], u64::MAX), 0);
    }

    #[test]
    fn reduction_needs_a_full_factor() {
        let plan =
            |cw: f64, ow: u32| Plan { left: 0.0, top: 0.0, width: cw, height: cw, out_w: ow, out_h: ow, flip: false };
        assert_eq!(reduction_factor(&plan(375.0, 224)), 1);
        assert_eq!(reduction_factor(&plan(750.0, 224)), 1);
        assert_eq!(reduction_factor(&plan(896.0, 224)), 2);
        assert_eq!(reduction_factor(&plan(1792.0, 224)), 4);
        assert_eq!(reduction_factor(&plan(8000.0, 224)), 4);
    }
}
