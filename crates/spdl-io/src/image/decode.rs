//! Decoding encoded bytes into interleaved 8-bit pixels, with limits checked from the header first.
//!
//! JPEG, the format of nearly every training set, goes straight to zune-jpeg (no copy of the encoded bytes,
//! one header parse, Y-only output for grayscale) or, when the transform shrinks the image at least 4x, to
//! jpeg-decoder's reduced-scale IDCT (1/2, 1/4), which skips most of the IDCT, upsampling and color
//! conversion work. Other formats go through the `image` crate's decoders with its `Limits` capped.
//! Every decoder call runs under `crate::error::guarded`: a decoder bug on hostile input is an `Error::Decode`.

use std::io::Cursor;

use image::metadata::Orientation;
use image::{ColorType, DynamicImage, ImageDecoder, ImageReader, Limits};
use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;

use crate::budget::{self, Reservation};
use crate::error::guarded;
use crate::image::format::{ImageFormat, detect_or_error};
use crate::image::pixels::{PixelStore, byte_len, oriented_dims, remap, sized};
use crate::image::transform::{Plan, Transform};
use crate::image::{ImageOptions, PixelFormat};
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
/// `reservation` holds the decode's working memory in the process-wide budget until the caller has
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
    budget::reserve(item, bytes)
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

/// Decodes `bytes` (format from the magic bytes) into `store` as `opts.format`, oriented if asked, and
/// plans `transform` on the result. `salt` seeds random crops and flips (the item's key, by default its
/// place in the batch). `tmp` is scratch.
pub(crate) fn decode<S: PixelStore>(
    bytes: &[u8],
    item: &str,
    opts: &ImageOptions,
    transform: &Transform,
    salt: u64,
    store: &mut S,
    tmp: &mut Vec<u8>,
) -> Result<Decoded> {
    let format = detect_or_error(bytes, item)?;
    guarded(item, format.name(), || match format {
        ImageFormat::Jpeg => {
            #[cfg(feature = "turbojpeg")]
            if let Some(d) = crate::image::turbo::decode_jpeg(bytes, item, opts, transform, salt, store, tmp)? {
                return Ok(d);
            }
            decode_jpeg(bytes, item, opts, transform, salt, store, tmp)
        }
        _ => decode_generic(bytes, item, format, opts, transform, salt, store, tmp),
    })
}

/// `(format, width, height)` from the header, without decoding pixels.
pub(crate) fn probe(bytes: &[u8], item: &str) -> Result<(ImageFormat, u32, u32)> {
    let format = detect_or_error(bytes, item)?;
    guarded(item, format.name(), || {
        let (w, h) = match format {
            ImageFormat::Jpeg => {
                let mut dec = zune(bytes, ColorSpace::RGB);
                dec.decode_headers().map_err(|e| decode_error(item, format, e))?;
                jpeg_dims(&dec, item)?
            }
            _ => {
                let opts = ImageOptions { max_pixels: u64::MAX, ..ImageOptions::default() };
                generic_decoder(bytes, item, format, &opts)?.0.dimensions()
            }
        };
        if w == 0 || h == 0 {
            return Err(decode_error(item, format, Issue::ZeroSize(w, h)));
        }
        Ok((format, w, h))
    })
}

fn zune(bytes: &[u8], out: ColorSpace) -> zune_jpeg::JpegDecoder<ZCursor<&[u8]>> {
    // Lenient (like libjpeg and browsers) about oddities between markers; truncation is checked separately.
    // JPEG's own maximum is 65535 per side: our pixel limit, checked after the header, is what bounds it.
    let options = DecoderOptions::default()
        .set_strict_mode(false)
        .set_max_width(usize::from(u16::MAX))
        .set_max_height(usize::from(u16::MAX))
        .jpeg_set_out_colorspace(out);
    zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options)
}

fn jpeg_dims(dec: &zune_jpeg::JpegDecoder<ZCursor<&[u8]>>, item: &str) -> Result<(u32, u32)> {
    let (w, h) = dec.dimensions().unwrap_or((0, 0));
    let w = u32::try_from(w).map_err(|e| decode_error(item, ImageFormat::Jpeg, e))?;
    let h = u32::try_from(h).map_err(|e| decode_error(item, ImageFormat::Jpeg, e))?;
    Ok((w, h))
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

#[allow(clippy::too_many_arguments)]
fn decode_jpeg<S: PixelStore>(
    bytes: &[u8],
    item: &str,
    opts: &ImageOptions,
    transform: &Transform,
    salt: u64,
    store: &mut S,
    tmp: &mut Vec<u8>,
) -> Result<Decoded> {
    const F: ImageFormat = ImageFormat::Jpeg;
    let cout = opts.format.channels();
    let want_luma = opts.format == PixelFormat::Gray8;
    let mut dec = zune(bytes, if want_luma { ColorSpace::Luma } else { ColorSpace::RGB });
    dec.decode_headers().map_err(|e| decode_error(item, F, e))?;
    let (w, h) = jpeg_dims(&dec, item)?;
    check_size(item, F, w, h, opts.max_pixels)?;
    check_jpeg_work(bytes, item, w, h, opts.max_scan_pixels)?;
    if !opts.allow_truncated && !jpeg_is_complete(bytes) {
        return Err(decode_error(item, F, Issue::Truncated));
    }
    let orientation =
        if opts.exif_orientation { exif_orientation(dec.exif().map(Vec::as_slice)) } else { Orientation::NoTransforms };
    let (ow, oh) = oriented_dims(orientation, w, h);
    let plan = transform.plan(ow, oh, salt);
    // zune keeps the component planes and the converted output: about twice the output per pixel.
    let reservation = admit(item, (w, h), 2 * u64::from(cout), cout, plan.as_ref(), opts.max_pixels)?;

    if opts.reduced_scale_jpeg
        && let Some(plan) = plan
    {
        let factor = reduction_factor(&plan);
        if factor > 1
            && let Some((width, height, plan)) =
                decode_jpeg_reduced(bytes, item, factor, (w, h), orientation, plan, cout, store)?
        {
            return Ok(Decoded { width, height, channels: cout, plan: Some(plan), _reservation: reservation });
        }
    }

    // zune converts YCbCr (and grayscale) to Y directly; other color spaces (CMYK, RGB) go through RGB.
    if want_luma && !matches!(dec.input_colorspace(), Some(ColorSpace::YCbCr | ColorSpace::Luma)) {
        dec = zune(bytes, ColorSpace::RGB);
        dec.decode_headers().map_err(|e| decode_error(item, F, e))?;
    }
    let native = match dec.output_colorspace() {
        Some(ColorSpace::Luma) => 1,
        _ => 3,
    };
    if native == cout && orientation == Orientation::NoTransforms {
        let out = store.slice(w, h, cout)?;
        dec.decode_into(out).map_err(|e| decode_error(item, F, e))?;
    } else {
        let t = sized(tmp, byte_len(w, h, native)?)?;
        dec.decode_into(t).map_err(|e| decode_error(item, F, e))?;
        let out = store.slice(ow, oh, cout)?;
        remap(t, w, h, native, orientation, out, cout);
    }
    Ok(Decoded { width: ow, height: oh, channels: cout, plan, _reservation: reservation })
}

/// The DCT reduction (4, 2 or 1) that keeps the decoded crop at least [`REDUCED_SCALE_MIN_GAP`] times the
/// output. 1/8 (DC only, an 8x8 box average) is never used: it lost 12 dB where 1/4 lost 2.5.
pub(crate) fn reduction_factor(plan: &Plan) -> u32 {
    let shrink = plan.shrink();
    [4u32, 2].into_iter().find(|&f| shrink >= f64::from(f) * REDUCED_SCALE_MIN_GAP).unwrap_or(1)
}

/// Decodes at 1/`factor` scale with jpeg-decoder, giving the decoded size and the scaled plan. `Ok(None)` when
/// the image is of a kind this path does not handle (CMYK, 16-bit), so the caller falls back to the full decode.
#[allow(clippy::too_many_arguments)]
fn decode_jpeg_reduced<S: PixelStore>(
    bytes: &[u8],
    item: &str,
    factor: u32,
    (w, h): (u32, u32),
    orientation: Orientation,
    plan: Plan,
    cout: u8,
    store: &mut S,
) -> Result<Option<(u32, u32, Plan)>> {
    const F: ImageFormat = ImageFormat::Jpeg;
    let mut dec = jpeg_decoder::Decoder::new(bytes);
    dec.read_info().map_err(|e| decode_error(item, F, e))?;
    let native = match dec.info().map(|i| i.pixel_format) {
        Some(jpeg_decoder::PixelFormat::L8) => 1u8,
        Some(jpeg_decoder::PixelFormat::RGB24) => 3,
        _ => return Ok(None),
    };
    let req_w = u16::try_from(w.div_ceil(factor)).unwrap_or(u16::MAX);
    let req_h = u16::try_from(h.div_ceil(factor)).unwrap_or(u16::MAX);
    let (dw, dh) = dec.scale(req_w, req_h).map_err(|e| decode_error(item, F, e))?;
    let (dw, dh) = (u32::from(dw), u32::from(dh));
    if dw >= w || dh >= h {
        return Ok(None);
    }
    let data = dec.decode().map_err(|e| decode_error(item, F, e))?;
    let expected = byte_len(dw, dh, native)?;
    if data.len() != expected {
        return Err(decode_error(item, F, Issue::Size { got: data.len(), width: dw, height: dh, channels: native }));
    }
    let (ow, oh) = oriented_dims(orientation, dw, dh);
    let out = store.slice(ow, oh, cout)?;
    remap(&data, dw, dh, native, orientation, out, cout);
    let (full_w, full_h) = oriented_dims(orientation, w, h);
    let plan = plan.scaled(f64::from(ow) / f64::from(full_w), f64::from(oh) / f64::from(full_h), ow, oh);
    Ok(Some((ow, oh, plan)))
}

/// Bytes a decoder may allocate for itself decoding `pixels` pixels: 16 per pixel (its rows or planes, up
/// to RGBA 32-bit float) plus the metadata allowance.
fn alloc_cap(pixels: u64, opts: &ImageOptions) -> u64 {
    pixels.saturating_mul(16).saturating_add(opts.max_metadata_bytes)
}

/// `(width, height)` from a header this module reads itself, before any decoder runs: PNG's IHDR, which
/// the format requires first. A PNG decoder reads every ancillary chunk before the pixels when it is
/// constructed, and keeps the allocation limit it was constructed with: that limit must come from the
/// declared size.
fn header_dims(bytes: &[u8], format: ImageFormat) -> Option<(u32, u32)> {
    match format {
        ImageFormat::Png if bytes.get(12..16) == Some(b"IHDR") => {
            let be = |at: usize| bytes.get(at..at + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
            Some((be(16)?, be(20)?))
        }
        _ => None,
    }
}

/// The decoder error, with the image crate's "limits exceeded" (the decoder's own allocations, i.e. its
/// metadata, over the allowance) named as such.
fn generic_error(item: &str, format: ImageFormat, cap: u64, e: image::ImageError) -> Error {
    match e {
        image::ImageError::Limits(_) => decode_error(item, format, Issue::DecoderMemory { limit: cap }),
        other => decode_error(item, format, other),
    }
}

/// A decoder for `bytes`, whose allocations are capped from the declared size where the header is read
/// first ([`header_dims`]: the pixel limit is checked before the decoder exists), else from the pixel
/// limit until the caller tightens it after the header.
fn generic_decoder<'a>(
    bytes: &'a [u8],
    item: &str,
    format: ImageFormat,
    opts: &ImageOptions,
) -> Result<(impl ImageDecoder + 'a, u64)> {
    let cap = match header_dims(bytes, format) {
        Some((w, h)) => {
            check_size(item, format, w, h, opts.max_pixels)?;
            alloc_cap(u64::from(w) * u64::from(h), opts)
        }
        // The decoder's own header check comes after construction: a small pixel limit must not fail it
        // first with a less clear error.
        None => alloc_cap(opts.max_pixels, opts).max(512 << 20),
    };
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format.to_image_crate());
    let mut limits = Limits::default();
    limits.max_alloc = Some(cap);
    reader.limits(limits);
    let dec = reader.into_decoder().map_err(|e| generic_error(item, format, cap, e))?;
    Ok((dec, cap))
}

#[allow(clippy::too_many_arguments)]
fn decode_generic<S: PixelStore>(
    bytes: &[u8],
    item: &str,
    format: ImageFormat,
    opts: &ImageOptions,
    transform: &Transform,
    salt: u64,
    store: &mut S,
    tmp: &mut Vec<u8>,
) -> Result<Decoded> {
    let cout = opts.format.channels();
    let (mut dec, cap) = generic_decoder(bytes, item, format, opts)?;
    let (w, h) = dec.dimensions();
    check_size(item, format, w, h, opts.max_pixels)?;
    // From here on the decoder may allocate no more than the declared pixels allow.
    let cap = cap.min(alloc_cap(u64::from(w) * u64::from(h), opts));
    let mut limits = Limits::default();
    let side = u32::try_from(opts.max_pixels).unwrap_or(u32::MAX);
    limits.max_image_width = Some(side);
    limits.max_image_height = Some(side);
    limits.max_alloc = Some(cap);
    dec.set_limits(limits).map_err(|e| generic_error(item, format, cap, e))?;
    let orientation = if opts.exif_orientation {
        dec.orientation().unwrap_or(Orientation::NoTransforms)
    } else {
        Orientation::NoTransforms
    };
    let (ow, oh) = oriented_dims(orientation, w, h);
    let plan = transform.plan(ow, oh, salt);
    // The decoder's own pixels (16-bit and float images too), and their 8-bit conversion.
    let decoded_bytes = u64::from(dec.color_type().bytes_per_pixel()) + 4;
    let reservation = admit(item, (w, h), decoded_bytes, cout, plan.as_ref(), opts.max_pixels)?;
    let native = match dec.color_type() {
        ColorType::L8 => Some(1u8),
        ColorType::La8 => Some(2),
        ColorType::Rgb8 => Some(3),
        ColorType::Rgba8 => Some(4),
        _ => None,
    };
    match native {
        Some(cin) if cin == cout && orientation == Orientation::NoTransforms => {
            let out = store.slice(w, h, cout)?;
            dec.read_image(out).map_err(|e| decode_error(item, format, e))?;
        }
        Some(cin) => {
            let t = sized(tmp, byte_len(w, h, cin)?)?;
            dec.read_image(t).map_err(|e| decode_error(item, format, e))?;
            let out = store.slice(ow, oh, cout)?;
            remap(t, w, h, cin, orientation, out, cout);
        }
        None => {
            // 16-bit and float images: let the image crate reduce them to 8 bits.
            let img = DynamicImage::from_decoder(dec).map_err(|e| decode_error(item, format, e))?;
            let color = img.color();
            let (data, cin) = match (color.has_color(), color.has_alpha()) {
                (false, false) => (img.into_luma8().into_raw(), 1),
                (false, true) => (img.into_luma_alpha8().into_raw(), 2),
                (true, false) => (img.into_rgb8().into_raw(), 3),
                (true, true) => (img.into_rgba8().into_raw(), 4),
            };
            if data.len() != byte_len(w, h, cin)? {
                return Err(decode_error(
                    item,
                    format,
                    Issue::Size { got: data.len(), width: w, height: h, channels: cin },
                ));
            }
            let out = store.slice(ow, oh, cout)?;
            remap(&data, w, h, cin, orientation, out, cout);
        }
    }
    Ok(Decoded { width: ow, height: oh, channels: cout, plan, _reservation: reservation })
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
    fn panics_become_decode_errors() {
        let r: Result<()> = guarded("x.jpg", "jpeg", || panic!("boom {}", 1));
        match r {
            Err(e @ Error::Decode { .. }) => assert!(e.to_string().contains("x.jpg"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    /// A 16 x 16 gray PNG with an iCCP chunk of `len` zeros (stored deflate blocks, so it is as large as
    /// the profile), written with the png crate's own chunk writer.
    fn png_with_icc(len: usize) -> Vec<u8> {
        let mut z = vec![0x78, 0x01];
        let mut left = len;
        loop {
            let n = left.min(65_535);
            left -= n;
            z.push(u8::from(left == 0));
            z.extend_from_slice(&(n as u16).to_le_bytes());
            z.extend_from_slice(&(!(n as u16)).to_le_bytes());
            z.resize(z.len() + n, 0);
            if left == 0 {
                break;
            }
        }
        z.extend_from_slice(&((((len % 65_521) as u32) << 16) | 1).to_be_bytes());
        let mut body = b"p\0\0".to_vec();
        body.extend_from_slice(&z);
        let mut out = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut out, 16, 16);
            enc.set_color(png::ColorType::Grayscale);
            let mut w = enc.write_header().unwrap_or_else(|e| panic!("{e}"));
            w.write_chunk(png::chunk::ChunkType(*b"iCCP"), &body).unwrap_or_else(|e| panic!("{e}"));
            w.write_image_data(&[0u8; 256]).unwrap_or_else(|e| panic!("{e}"));
        }
        out
    }

    #[test]
    fn png_metadata_is_held_to_the_allowance() {
        let icc = |bytes: &[u8], opts: &ImageOptions| {
            generic_decoder(bytes, "icc.png", ImageFormat::Png, opts)
                .map(|(mut dec, _)| dec.icc_profile().ok().flatten().map(|p| p.len()))
        };
        let opts = ImageOptions::default();
        // A real-sized profile is read.
        assert_eq!(icc(&png_with_icc(1 << 20), &opts).ok(), Some(Some(1 << 20)));
        // A chunk larger than the allowance (16 MiB + 16 bytes a pixel) is refused as it is read. (A small
        // compressed chunk inflating past it is inflated up to the allowance, then dropped: the png crate
        // ignores a profile it cannot read; `tests/hostile_cost.rs` decodes such a bomb.)
        let big = png_with_icc(24 << 20);
        let err = icc(&big, &opts).err().map(|e| spdl_report::error_chain(&e)).unwrap_or_default();
        assert!(err.contains("icc.png") && err.contains("allowance of 16781312 bytes"), "{err}");
        let roomy = ImageOptions { max_metadata_bytes: 128 << 20, ..ImageOptions::default() };
        assert_eq!(icc(&big, &roomy).ok(), Some(Some(24 << 20)));
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
