//! Decoding every supported format on real files made here, checked against reference decoders.
#![cfg(feature = "synth")]

mod image_util;

use image_util::*;
use spdl_buffer::{DType, Layout};
use spdl_io::Error;
use spdl_io::image::{ImageFormat, ImageOptions, PixelFormat, ResizeFilter, Transform, image_info, load_image};

#[test]
fn lossless_formats_round_trip_exactly() {
    let (w, h) = (97, 61); // odd sizes catch stride bugs
    let original = photo(11, w, h);
    for format in [ImageFormat::Png, ImageFormat::Bmp, ImageFormat::Tiff, ImageFormat::Webp] {
        let bytes = spdl_io::synth::encode(&original, w, h, format).unwrap();
        assert_eq!(ImageFormat::detect(&bytes), Some(format));
        let info = image_info(&bytes, "x").unwrap();
        assert_eq!((info.format, info.width, info.height), (format, w, h));
        let buf = decode(&bytes, &ImageOptions::default(), &Transform::None).unwrap();
        assert_eq!(buf.shape(), &[h as usize, w as usize, 3], "{format}");
        assert_eq!((buf.dtype(), buf.layout()), (DType::U8, Layout::Hwc));
        assert_eq!(buf.as_bytes(), &original[..], "{format} pixels differ from the original");
    }
}

#[test]
fn gif_matches_the_reference_decoder_and_is_close_to_the_original() {
    let (w, h) = (80, 60);
    let original = photo(12, w, h);
    let gif = spdl_io::synth::encode(&original, w, h, ImageFormat::Gif).unwrap();
    let ours = decode_rgb(&gif);
    let (reference, rw, rh) = reference_image(&gif);
    assert_eq!((rw, rh), (w, h));
    assert_eq!(ours, reference);
    let (mean, _) = diff(&ours, &original); // 256-color quantization
    assert!(mean < 12.0, "mean diff to the original {mean}");
}

#[test]
fn animated_gif_gives_the_first_frame() {
    use image::codecs::gif::GifEncoder;
    let (w, h) = (32u32, 24u32);
    let frame = |v: u8| image::Frame::new(image::RgbaImage::from_pixel(w, h, image::Rgba([v, 255 - v, 40, 255])));
    let mut gif = Vec::new();
    {
        let mut enc = GifEncoder::new(&mut gif);
        enc.encode_frames([frame(200), frame(10), frame(90)]).unwrap();
    }
    let px = decode_rgb(&gif);
    assert_eq!(&px[..3], &[200, 55, 40]);
    assert!(px.chunks(3).all(|p| p == [200, 55, 40]));
}

#[test]
fn baseline_and_progressive_jpeg_match_an_independent_decoder() {
    let (w, h) = (333, 250);
    let original = photo(13, w, h);
    for progressive in [false, true] {
        let bytes = jpeg(13, w, h, progressive);
        // SOF0 = baseline, SOF2 = progressive.
        let sof2 = bytes.windows(2).any(|m| m == [0xFF, 0xC2]);
        assert_eq!(sof2, progressive, "progressive={progressive}: wrong frame type");
        let ours = decode_rgb(&bytes);
        let (reference, rw, rh) = reference_jpeg(&bytes);
        assert_eq!((rw, rh), (w, h));
        let (mean, max) = diff(&ours, &reference);
        // Decoders differ in IDCT rounding and chroma upsampling; both must be close to each other and to
        // the image that was encoded.
        assert!(mean < 1.5, "progressive={progressive}: mean diff {mean} (max {max})");
        let p = psnr(&ours, &original);
        assert!(p > 30.0, "progressive={progressive}: PSNR to the original {p:.1} dB");
    }
}

#[test]
fn pixel_formats() {
    let (w, h) = (64, 48);
    let jpg = jpeg(14, w, h, false);
    let png = encoded(14, w, h, ImageFormat::Png);
    for (bytes, is_jpeg) in [(&jpg, true), (&png, false)] {
        let rgb = decode_rgb(bytes);
        let gray =
            decode(bytes, &ImageOptions { format: PixelFormat::Gray8, ..ImageOptions::default() }, &Transform::None)
                .unwrap();
        assert_eq!(gray.shape(), &[48, 64, 1]);
        // BT.601 luma of the RGB decode. JPEG's gray is its Y plane straight from the decoder, which differs
        // from the luma of the decoded RGB only where RGB was clipped to 0..255 (saturated colors).
        let luma: Vec<u8> = rgb
            .chunks(3)
            .map(|p| (0.299 * f64::from(p[0]) + 0.587 * f64::from(p[1]) + 0.114 * f64::from(p[2])).round() as u8)
            .collect();
        let (mean, max) = diff(gray.as_bytes(), &luma);
        if is_jpeg {
            assert!(mean < 0.5, "gray vs luma: mean {mean} max {max}");
        } else {
            assert!(max <= 1, "gray vs luma: mean {mean} max {max}");
        }
        let rgba =
            decode(bytes, &ImageOptions { format: PixelFormat::Rgba8, ..ImageOptions::default() }, &Transform::None)
                .unwrap();
        assert_eq!(rgba.shape(), &[48, 64, 4]);
        for (a, b) in rgba.as_bytes().chunks(4).zip(rgb.chunks(3)) {
            assert_eq!(&a[..3], b);
            assert_eq!(a[3], 255);
        }
    }
}

#[test]
fn png_variants_16bit_palette_gray_alpha() {
    let (w, h) = (20u32, 10u32);
    // 16-bit RGB: values v * 257 reduce exactly to v.
    let rgb8 = photo(15, w, h);
    let rgb16: Vec<u16> = rgb8.iter().map(|&v| u16::from(v) * 257).collect();
    let img16 = image::ImageBuffer::<image::Rgb<u16>, _>::from_raw(w, h, rgb16).unwrap();
    let bytes = png_of(image::DynamicImage::ImageRgb16(img16));
    assert_eq!(decode_rgb(&bytes), rgb8);

    // Palette with transparency, written with the png crate.
    let palette = [255u8, 0, 0, 0, 255, 0, 0, 0, 255, 9, 9, 9];
    let trns = [255u8, 128, 0, 255];
    let indices: Vec<u8> = (0..w * h).map(|i| (i % 4) as u8).collect();
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, w, h);
        enc.set_color(png::ColorType::Indexed);
        enc.set_depth(png::BitDepth::Eight);
        enc.set_palette(&palette[..]);
        enc.set_trns(&trns[..]);
        enc.write_header().unwrap().write_image_data(&indices).unwrap();
    }
    let rgba =
        decode(&bytes, &ImageOptions { format: PixelFormat::Rgba8, ..ImageOptions::default() }, &Transform::None)
            .unwrap();
    for (px, &i) in rgba.as_bytes().chunks(4).zip(&indices) {
        let i = usize::from(i);
        assert_eq!(px, [palette[3 * i], palette[3 * i + 1], palette[3 * i + 2], trns[i]]);
    }
    let rgb = decode_rgb(&bytes); // alpha dropped, colors kept
    assert_eq!(&rgb[..6], &[255, 0, 0, 0, 255, 0]);

    // Gray + alpha: gray replicated, alpha kept.
    let la = image::GrayAlphaImage::from_fn(w, h, |x, y| image::LumaA([(x * 10) as u8, (y * 20) as u8]));
    let bytes = png_of(image::DynamicImage::ImageLumaA8(la.clone()));
    let rgba =
        decode(&bytes, &ImageOptions { format: PixelFormat::Rgba8, ..ImageOptions::default() }, &Transform::None)
            .unwrap();
    for (px, src) in rgba.as_bytes().chunks(4).zip(la.pixels()) {
        assert_eq!(px, [src[0], src[0], src[0], src[1]]);
    }
    let gray =
        decode(&bytes, &ImageOptions { format: PixelFormat::Gray8, ..ImageOptions::default() }, &Transform::None)
            .unwrap();
    assert_eq!(gray.as_bytes(), la.pixels().map(|p| p[0]).collect::<Vec<_>>());
}

/// A minimal little-endian EXIF (TIFF) block holding only the orientation tag.
fn exif_orientation(value: u16) -> Vec<u8> {
    let mut t = b"II*\0".to_vec();
    t.extend_from_slice(&8u32.to_le_bytes()); // IFD offset
    t.extend_from_slice(&1u16.to_le_bytes()); // one entry
    t.extend_from_slice(&0x0112u16.to_le_bytes()); // Orientation
    t.extend_from_slice(&3u16.to_le_bytes()); // SHORT
    t.extend_from_slice(&1u32.to_le_bytes()); // count
    t.extend_from_slice(&value.to_le_bytes());
    t.extend_from_slice(&[0, 0]);
    t.extend_from_slice(&0u32.to_le_bytes()); // no next IFD
    t
}

/// The image flipped vertically (a wrong orientation of the same size, for a negative control).
fn rotate_back(px: &[u8], w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_raw(w, h, px.to_vec()).unwrap();
    image::imageops::flip_vertical(&img).into_raw()
}

#[test]
fn exif_orientation_is_applied_when_asked() {
    let (w, h) = (60u32, 40u32);
    let px = photo(16, w, h);
    let mut bytes = Vec::new();
    let mut enc = jpeg_encoder::Encoder::new(&mut bytes, 95);
    enc.add_exif_metadata(&exif_orientation(6)).unwrap(); // 6 = rotate 90 degrees clockwise
    enc.encode(&px, w as u16, h as u16, jpeg_encoder::ColorType::Rgb).unwrap();

    let stored = decode(&bytes, &ImageOptions::default(), &Transform::None).unwrap();
    assert_eq!(stored.shape(), &[40, 60, 3]);
    let oriented =
        decode(&bytes, &ImageOptions { exif_orientation: true, ..ImageOptions::default() }, &Transform::None).unwrap();
    assert_eq!(oriented.shape(), &[60, 40, 3]);
    let mut expected =
        image::DynamicImage::ImageRgb8(image::RgbImage::from_raw(w, h, stored.as_bytes().to_vec()).unwrap());
    expected.apply_orientation(image::metadata::Orientation::Rotate90);
    assert_eq!(oriented.as_bytes(), expected.into_rgb8().as_raw().as_slice());

    // Transforms see the oriented image; the reduced-scale path agrees with the full one on orientation.
    for reduced in [false, true] {
        let t = Transform::resize(10, 15);
        let opts = ImageOptions { exif_orientation: true, reduced_scale_jpeg: reduced, ..ImageOptions::default() };
        let small = decode(&bytes, &opts, &t).unwrap();
        assert_eq!(small.shape(), &[15, 10, 3]);
        // The reference: the oriented full decode resized (for reduced=true the 1/4-scale IDCT stands
        // in for part of the resize, so it is close rather than equal).
        let reference = reference_resize(oriented.as_bytes(), 40, 60, 10, 15);
        let (mean, _) = diff(small.as_bytes(), &reference);
        assert!(mean < 6.0, "reduced={reduced}: mean diff {mean}");
        // Orientation was applied: the rotated reference matches far better than the unrotated one would.
        let wrong = reference_resize(&rotate_back(oriented.as_bytes(), 40, 60), 40, 60, 10, 15);
        assert!(diff(small.as_bytes(), &wrong).0 > 2.0 * mean, "reduced={reduced}: orientation not applied");
    }
}

#[test]
fn resize_matches_a_reference_resampler() {
    let (w, h) = (300, 200);
    let png = encoded(17, w, h, ImageFormat::Png);
    let original = photo(17, w, h);
    let out = decode(&png, &ImageOptions::default(), &Transform::resize(120, 90)).unwrap();
    assert_eq!(out.shape(), &[90, 120, 3]);
    let (mean, max) = diff(out.as_bytes(), &reference_resize(&original, w, h, 120, 90));
    assert!(mean < 1.0, "mean {mean} max {max}");

    // Shorter side 256 then center crop 224, vs doing exactly that with the image crate.
    let t = Transform::imagenet_eval();
    let out = decode(&png, &ImageOptions::default(), &t).unwrap();
    assert_eq!(out.shape(), &[224, 224, 3]);
    let resized = reference_resize(&original, w, h, 384, 256);
    let img = image::RgbImage::from_raw(384, 256, resized).unwrap();
    let crop = image::imageops::crop_imm(&img, 80, 16, 224, 224).to_image().into_raw();
    let (mean, max) = diff(out.as_bytes(), &crop);
    assert!(mean < 1.5, "mean {mean} max {max}");

    // Every filter runs and gives the requested size; nearest picks source pixels.
    for filter in [
        ResizeFilter::Nearest,
        ResizeFilter::Box,
        ResizeFilter::Bilinear,
        ResizeFilter::Hamming,
        ResizeFilter::Bicubic,
        ResizeFilter::Mitchell,
        ResizeFilter::Lanczos3,
    ] {
        let out =
            decode(&png, &ImageOptions::default(), &Transform::Resize { width: 150, height: 100, filter }).unwrap();
        assert_eq!(out.shape(), &[100, 150, 3]);
        let (mean, _) = diff(out.as_bytes(), &reference_resize(&original, w, h, 150, 100));
        assert!(mean < 6.0, "{filter:?}: mean {mean}");
    }
    // Upscaling works too.
    let out = decode(&png, &ImageOptions::default(), &Transform::resize(640, 480)).unwrap();
    assert_eq!(out.shape(), &[480, 640, 3]);
}

#[test]
fn random_resized_crop_is_deterministic_per_seed() {
    let png = encoded(18, 200, 150, ImageFormat::Png);
    let o = ImageOptions::default();
    let a = decode(&png, &o, &Transform::random_resized_crop(64, 64, 1)).unwrap();
    let b = decode(&png, &o, &Transform::random_resized_crop(64, 64, 1)).unwrap();
    let c = decode(&png, &o, &Transform::random_resized_crop(64, 64, 2)).unwrap();
    assert_eq!(a.shape(), &[64, 64, 3]);
    assert_eq!(a.as_bytes(), b.as_bytes());
    assert_ne!(a.as_bytes(), c.as_bytes());
}

#[test]
fn files_are_read_by_content_not_extension() {
    let dir = tempfile::tempdir().unwrap();
    let png = encoded(19, 30, 20, ImageFormat::Png);
    let path = dir.path().join("actually_png.jpg");
    std::fs::write(&path, &png).unwrap();
    let buf = load_image(&path, &ImageOptions::default(), &Transform::None, &alloc()).unwrap();
    assert_eq!(buf.as_bytes(), &photo(19, 30, 20)[..]);

    let missing = dir.path().join("missing.jpg");
    match load_image(&missing, &ImageOptions::default(), &Transform::None, &alloc()) {
        Err(Error::Io { path, .. }) => assert_eq!(path, missing),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_output_comes_from_the_given_allocator() {
    use spdl_buffer::{Block, BufferError, HostAllocator, SharedAllocator, SystemAllocator};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Debug, Default)]
    struct Counting(AtomicUsize);
    impl HostAllocator for Counting {
        fn allocate(&self, layout: std::alloc::Layout) -> Result<Block, BufferError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            SystemAllocator.allocate(layout)
        }
        fn release(&self, block: Block) {
            SystemAllocator.release(block)
        }
        fn name(&self) -> &str {
            "counting"
        }
    }
    let counting = Arc::new(Counting::default());
    let a: SharedAllocator = counting.clone();
    let jpg = jpeg(20, 64, 64, false);
    for t in [Transform::None, Transform::resize(32, 32)] {
        let buf = spdl_io::image::decode_image(&jpg, "x.jpg", &ImageOptions::default(), &t, &a).unwrap();
        assert_eq!(buf.allocator().name(), "counting");
    }
    assert_eq!(counting.0.load(Ordering::SeqCst), 2);
}

#[test]
fn grayscale_and_cmyk_jpegs() {
    let (w, h) = (64u16, 40u16);
    let rgb = photo(21, u32::from(w), u32::from(h));
    let luma: Vec<u8> = rgb.chunks(3).map(|p| p[1]).collect();
    let mut gray_jpeg = Vec::new();
    jpeg_encoder::Encoder::new(&mut gray_jpeg, 90).encode(&luma, w, h, jpeg_encoder::ColorType::Luma).unwrap();
    let gray =
        decode(&gray_jpeg, &ImageOptions { format: PixelFormat::Gray8, ..ImageOptions::default() }, &Transform::None)
            .unwrap();
    let mut reference = jpeg_decoder::Decoder::new(gray_jpeg.as_slice());
    let reference = reference.decode().unwrap();
    let (mean, _) = diff(gray.as_bytes(), &reference);
    assert!(mean < 1.0, "{mean}");
    let as_rgb = decode_rgb(&gray_jpeg);
    for (p, g) in as_rgb.chunks(3).zip(gray.as_bytes()) {
        assert_eq!(p, [*g, *g, *g]);
    }

    // CMYK (Adobe) JPEGs are converted to RGB; the reduced-scale path hands them to the full decoder.
    let cmyk: Vec<u8> = rgb.chunks(3).flat_map(|p| [255 - p[0], 255 - p[1], 255 - p[2], 0]).collect();
    let mut cmyk_jpeg = Vec::new();
    jpeg_encoder::Encoder::new(&mut cmyk_jpeg, 95).encode(&cmyk, w, h, jpeg_encoder::ColorType::Cmyk).unwrap();
    let t = Transform::resize(8, 5);
    let full = decode(&cmyk_jpeg, &ImageOptions { reduced_scale_jpeg: false, ..ImageOptions::default() }, &t).unwrap();
    let reduced = decode(&cmyk_jpeg, &ImageOptions::default(), &t).unwrap();
    assert_eq!(full.shape(), &[5, 8, 3]);
    assert_eq!(full.as_bytes(), reduced.as_bytes());
    let decoded = decode_rgb(&cmyk_jpeg);
    assert_eq!(decoded.len(), rgb.len());
}
