//! Reduced-scale (DCT-domain) JPEG decoding gives the same quality as a full decode + resize.
#![cfg(feature = "synth")]

mod image_util;

use image_util::*;
use spdl_io::image::{ImageOptions, PixelFormat, Transform};

fn run(w: u32, h: u32, t: Transform, format: PixelFormat) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let original = photo(50, w, h);
    let bytes = spdl_io::synth::encode_jpeg(&original, w, h, 90, false).unwrap();
    let opts = |reduced| ImageOptions { reduced_scale_jpeg: reduced, format, ..ImageOptions::default() };
    let full = decode(&bytes, &opts(false), &t).unwrap().as_bytes().to_vec();
    let reduced = decode(&bytes, &opts(true), &t).unwrap().as_bytes().to_vec();
    let (ow, oh) = t.output_size().unwrap();
    let truth = reference_resize(&original, w, h, ow, oh);
    (full, reduced, truth)
}

#[test]
fn reduced_scale_matches_full_decode_quality() {
    // Cases that shrink at least 4x (1/2 decode) or 8x (1/4 decode).
    for (w, h, out) in [(2000, 1500, 224), (1000, 750, 112), (500, 375, 64), (2000, 1500, 112), (2000, 1500, 64)] {
        let (full, reduced, truth) = run(w, h, Transform::resize(out, out), PixelFormat::Rgb8);
        assert_ne!(full, reduced, "{w}x{h} -> {out}: the reduced-scale path was not taken");
        let (p_full, p_reduced, p_between) = (psnr(&full, &truth), psnr(&reduced, &truth), psnr(&reduced, &full));
        eprintln!(
            "{w}x{h} -> {out}x{out}: PSNR vs uncompressed + same resize: full {p_full:.2} dB, reduced {p_reduced:.2} dB; \
             reduced vs full {p_between:.2} dB"
        );
        // Far below what the eye (or a model) can tell, and close to the full path's own error.
        assert!(p_between > 40.0, "{w}x{h} -> {out}: reduced vs full {p_between:.2} dB");
        assert!(p_reduced >= p_full - 3.0, "{w}x{h} -> {out}: reduced {p_reduced:.2} dB vs full {p_full:.2} dB");
    }
}

#[test]
fn reduced_scale_is_not_used_below_a_4x_shrink() {
    // ImageNet-size images to 224 (1.7x) and even 1000x750 -> 224 (3.3x): full decode, identical output.
    for (w, h, t) in [
        (500, 375, Transform::resize(224, 224)),
        (500, 375, Transform::imagenet_eval()),
        (1000, 750, Transform::resize(224, 224)),
    ] {
        let (full, reduced, _) = run(w, h, t, PixelFormat::Rgb8);
        assert_eq!(full, reduced, "{w}x{h} {t:?}");
    }
}

#[test]
fn reduced_scale_handles_gray_crops_and_odd_sizes() {
    let t = Transform::ResizeShorterCenterCrop {
        shorter: 128,
        crop_width: 112,
        crop_height: 100,
        filter: spdl_io::image::ResizeFilter::Bilinear,
    };
    let (full, reduced, _) = run(1001, 757, t, PixelFormat::Gray8);
    assert_eq!(full.len(), 112 * 100);
    assert_ne!(full, reduced);
    assert!(psnr(&reduced, &full) > 40.0, "{}", psnr(&reduced, &full));
    // A random crop of at least 0.5 of the area of a 1999x1333 image still shrinks > 4x to 64x64.
    let t = Transform::RandomResizedCrop {
        width: 64,
        height: 64,
        scale: (0.5, 1.0),
        ratio: (0.75, 1.333),
        seed: 3,
        hflip: 0.0,
        filter: spdl_io::image::ResizeFilter::Bilinear,
    };
    let (full, reduced, _) = run(1999, 1333, t, PixelFormat::Rgba8);
    assert_eq!(full.len(), 64 * 64 * 4);
    assert_ne!(full, reduced);
    assert!(psnr(&reduced, &full) > 38.0, "{}", psnr(&reduced, &full));
}
