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

use crate::error::guarded;
use crate::image::admit::{
    Decoded, Issue, admit, check_jpeg_work, check_size, decode_error, exif_orientation, jpeg_is_complete,
    reduction_factor,
};
use crate::image::format::{ImageFormat, detect_or_error};
use crate::image::pixels::{PixelStore, byte_len, oriented_dims, remap, sized};
use crate::image::transform::{Plan, Transform};
use crate::image::{ImageOptions, PixelFormat};
use crate::{Error, Result};

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
}

/// libjpeg-turbo's region path (`turbo`, which [`decode`] takes for JPEG) against the reference of a full
/// decode followed by the same crop and resize.
#[cfg(all(test, feature = "synth", feature = "turbojpeg"))]
mod turbo_region_tests {
    use fast_image_resize::Resizer;

    use super::*;
    use crate::image::ResizeFilter;
    use crate::image::pixels::{Pixels, resize_into};

    fn jpeg(w: u32, h: u32, seed: u64, progressive: bool) -> Vec<u8> {
        let rgb = crate::synth::photo(seed, w, h);
        crate::synth::encode_jpeg(&rgb, w, h, 90, progressive).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Full decode (no transform): the reference pixels.
    fn full(bytes: &[u8], opts: &ImageOptions) -> Pixels {
        let (mut data, mut tmp) = (Vec::new(), Vec::new());
        let d =
            decode(bytes, "ref.jpg", opts, &Transform::None, 0, &mut data, &mut tmp).unwrap_or_else(|e| panic!("{e}"));
        Pixels { data, width: d.width, height: d.height, channels: d.channels }
    }

    fn resize(px: &Pixels, plan: &Plan) -> Vec<u8> {
        let mut out = vec![0u8; (plan.out_w * plan.out_h) as usize * usize::from(px.channels)];
        resize_into(&mut Resizer::new(), px, plan, ResizeFilter::Bilinear, &mut out, "x")
            .unwrap_or_else(|e| panic!("{e}"));
        out
    }

    fn psnr(a: &[u8], b: &[u8]) -> f64 {
        let mse = a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum::<f64>() / a.len() as f64;
        if mse == 0.0 { f64::INFINITY } else { 10.0 * (255.0f64 * 255.0 / mse).log10() }
    }

    fn transforms(seed: u64) -> Vec<Transform> {
        vec![Transform::imagenet_eval(), Transform::resize(224, 224), Transform::random_resized_crop(224, 224, seed)]
    }

    #[test]
    fn region_decode_equals_full_decode_then_crop() {
        let opts = ImageOptions { reduced_scale_jpeg: false, ..ImageOptions::default() };
        for (w, h, progressive) in [(640, 427, false), (333, 500, true), (1001, 677, false)] {
            let bytes = jpeg(w, h, u64::from(w), progressive);
            let reference = full(&bytes, &opts);
            for salt in 0..20u64 {
                let t = Transform::random_resized_crop(224, 224, 7);
                let (mut data, mut tmp) = (Vec::new(), Vec::new());
                let d = decode(&bytes, "x.jpg", &opts, &t, salt, &mut data, &mut tmp).unwrap_or_else(|e| panic!("{e}"));
                let (Some(moved), Some(plan)) = (d.plan, t.plan(w, h, salt)) else { panic!("no plan") };
                let (x0, y0) = ((plan.left - moved.left).round() as u32, (plan.top - moved.top).round() as u32);
                assert!(d.width <= w && d.height <= h);
                let mut diff = 0u64;
                for y in 0..d.height {
                    for x in 0..d.width * 3 {
                        let got = data[(y * d.width * 3 + x) as usize];
                        let want = reference.data[((y + y0) * w * 3 + x0 * 3 + x) as usize];
                        diff += u64::from(got.abs_diff(want));
                    }
                }
                let mad = diff as f64 / f64::from(d.width * d.height * 3);
                assert!(mad <= 1.0, "{w}x{h} salt {salt}: mean absolute difference {mad}");
            }
        }
    }

    #[test]
    fn fused_outputs_match_the_reference_within_40_db() {
        for (w, h) in [(640, 427), (500, 375), (2000, 1500), (257, 911)] {
            let bytes = jpeg(w, h, u64::from(h), false);
            let reference = full(&bytes, &ImageOptions::default());
            for t in transforms(3) {
                for salt in 0..8u64 {
                    let (mut data, mut tmp) = (Vec::new(), Vec::new());
                    let opts = ImageOptions::default();
                    let d =
                        decode(&bytes, "x.jpg", &opts, &t, salt, &mut data, &mut tmp).unwrap_or_else(|e| panic!("{e}"));
                    let px = Pixels { data, width: d.width, height: d.height, channels: d.channels };
                    let fused = resize(&px, &d.plan.unwrap_or_else(|| panic!("plan")));
                    let want = resize(&reference, &t.plan(w, h, salt).unwrap_or_else(|| panic!("plan")));
                    let p = psnr(&fused, &want);
                    assert!(p >= 40.0, "{w}x{h} {t:?} salt {salt}: {p:.1} dB");
                }
            }
        }
    }

    #[test]
    fn a_failed_decode_does_not_change_the_next_one() {
        let good = jpeg(320, 240, 1, false);
        let opts = ImageOptions { allow_truncated: true, ..ImageOptions::default() };
        let run = |bytes: &[u8]| {
            let (mut data, mut tmp) = (Vec::new(), Vec::new());
            decode(bytes, "x.jpg", &opts, &Transform::resize(40, 30), 0, &mut data, &mut tmp).map(|_| data)
        };
        let first = run(&good).unwrap_or_else(|e| panic!("{e}"));
        for cut in [24, 32, 44, 200, good.len() / 2] {
            let _ = run(&good[..cut]);
            assert!(run(&good).ok().as_ref() == Some(&first), "after a file cut at {cut}: the next decode changed");
        }
    }
}
