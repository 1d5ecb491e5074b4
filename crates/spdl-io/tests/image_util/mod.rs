//! Shared helpers of the image integration tests: test media made on the spot, and pixel comparisons.
#![allow(dead_code)]

use std::io::Cursor;

use spdl_buffer::{Buffer, SharedAllocator, system_allocator};
use spdl_io::image::{ImageFormat, ImageOptions, Transform, decode_image};
use spdl_io::synth;

pub fn alloc() -> SharedAllocator {
    system_allocator()
}

/// A photo-like RGB image and its size.
pub fn photo(seed: u64, w: u32, h: u32) -> Vec<u8> {
    synth::photo(seed, w, h)
}

pub fn encoded(seed: u64, w: u32, h: u32, format: ImageFormat) -> Vec<u8> {
    synth::encode(&photo(seed, w, h), w, h, format).expect("encode")
}

pub fn jpeg(seed: u64, w: u32, h: u32, progressive: bool) -> Vec<u8> {
    synth::encode_jpeg(&photo(seed, w, h), w, h, 90, progressive).expect("encode jpeg")
}

pub fn decode(bytes: &[u8], opts: &ImageOptions, t: &Transform) -> spdl_io::Result<Buffer> {
    decode_image(bytes, "test-item", opts, t, &alloc())
}

pub fn decode_rgb(bytes: &[u8]) -> Vec<u8> {
    decode(bytes, &ImageOptions::default(), &Transform::None).expect("decode").as_bytes().to_vec()
}

/// Mean absolute difference and maximum difference of two equally long byte images.
pub fn diff(a: &[u8], b: &[u8]) -> (f64, u8) {
    assert_eq!(a.len(), b.len(), "sizes differ");
    let mut sum = 0u64;
    let mut max = 0u8;
    for (x, y) in a.iter().zip(b) {
        let d = x.abs_diff(*y);
        sum += u64::from(d);
        max = max.max(d);
    }
    (sum as f64 / a.len().max(1) as f64, max)
}

/// Peak signal-to-noise ratio in dB (8-bit).
pub fn psnr(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len(), "sizes differ");
    let mse =
        a.iter().zip(b).map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2)).sum::<f64>() / a.len().max(1) as f64;
    if mse == 0.0 { f64::INFINITY } else { 10.0 * (255.0f64 * 255.0 / mse).log10() }
}

/// Reference decode with jpeg-decoder (an independent JPEG decoder), RGB.
pub fn reference_jpeg(bytes: &[u8]) -> (Vec<u8>, u32, u32) {
    let mut d = jpeg_decoder::Decoder::new(bytes);
    let px = d.decode().expect("reference decode");
    let info = d.info().expect("info");
    assert_eq!(info.pixel_format, jpeg_decoder::PixelFormat::RGB24);
    (px, u32::from(info.width), u32::from(info.height))
}

/// Reference decode with the `image` crate (RGB8).
pub fn reference_image(bytes: &[u8]) -> (Vec<u8>, u32, u32) {
    let img = image::load_from_memory(bytes).expect("reference decode").into_rgb8();
    let (w, h) = img.dimensions();
    (img.into_raw(), w, h)
}

/// Reference resize with the `image` crate (separable, antialiased triangle = bilinear).
pub fn reference_resize(rgb: &[u8], w: u32, h: u32, ow: u32, oh: u32) -> Vec<u8> {
    let img = image::RgbImage::from_raw(w, h, rgb.to_vec()).expect("raw");
    image::imageops::resize(&img, ow, oh, image::imageops::FilterType::Triangle).into_raw()
}

pub fn png_of(img: image::DynamicImage) -> Vec<u8> {
    let mut out = Vec::new();
    img.write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png).expect("png");
    out
}
