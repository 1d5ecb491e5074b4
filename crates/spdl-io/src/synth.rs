//! Deterministic, photo-like synthetic images: the demo dataset and the test corpora.
//!
//! [`photo`] draws an RGB image from a seed: a sky/ground gradient with a textured horizon, fractal value
//! noise (fBm) for texture and lighting, a few hard-edged shapes and sensor-like grain, so that JPEG sizes
//! and decode costs resemble real photos (flat colors would compress to nothing and decode unrealistically
//! fast). [`photo_size`] draws ImageNet-like sizes (mostly 500x375). [`encode`] writes any supported
//! format; [`write_dataset`] writes an ImageNet-style tree of JPEGs on all cores, idempotently.
//!
//! The PRNG is a SplitMix64 written here, so the same seed gives the same pixels on every platform and
//! release (the encoded bytes depend on the encoder versions).
//!
//! # Example
//! ```
//! use spdl_io::image::{ImageFormat, image_info};
//! use spdl_io::synth;
//!
//! let (w, h) = (160, 120);
//! let pixels = synth::photo(7, w, h);
//! assert_eq!(pixels, synth::photo(7, w, h)); // deterministic
//! let jpeg = synth::encode(&pixels, w, h, ImageFormat::Jpeg)?;
//! assert_eq!(image_info(&jpeg, "synthetic.jpg")?.width, 160);
//!
//! let dir = std::env::temp_dir().join(format!("spdl-synth-doc-{}", std::process::id()));
//! let paths = synth::write_dataset(&dir, 4, 1, 2)?;
//! assert!(paths[1].ends_with("class_001/img_00001.jpg"));
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), spdl_io::Error>(())
//! ```

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use image::ImageEncoder;

use crate::image::ImageFormat;
use crate::image::rng::{SplitMix64, mix};
use crate::{Error, Result};

/// JPEG quality used by [`encode`] and [`write_dataset`] (ImageNet's files are mostly around 90).
pub const JPEG_QUALITY: u8 = 90;

/// A width and height for image `seed`: half are 500x375 (ImageNet's most common size), some 375x500,
/// the rest anywhere in 350–640 x 260–500.
pub fn photo_size(seed: u64) -> (u32, u32) {
    let mut rng = SplitMix64::new(mix(seed, 0x517E));
    match rng.below(20) {
        0..=9 => (500, 375),
        10..=12 => (375, 500),
        _ => (350 + rng.below(291) as u32, 260 + rng.below(241) as u32),
    }
}

/// Fractal value noise on a random lattice: smooth, deterministic texture in `[0, 1]`.
struct ValueNoise {
    octaves: Vec<Octave>,
    norm: f32,
}

struct Octave {
    lattice: Vec<f32>,
    stride: usize,
    /// Per column: lattice cell and smoothed fraction.
    xs: Vec<(usize, f32)>,
    /// Per row: lattice cell and smoothed fraction.
    ys: Vec<(usize, f32)>,
    amp: f32,
}

fn smooth(t: f32) -> f32 {
    t * t * (3.0 - 2.0 * t)
}

impl ValueNoise {
    fn new(rng: &mut SplitMix64, w: u32, h: u32, period: f32, octaves: u32) -> ValueNoise {
        let mut out = Vec::new();
        let (mut p, mut amp, mut norm) = (period.max(2.0), 1.0f32, 0.0f32);
        for _ in 0..octaves {
            let gw = (w as f32 / p) as usize + 2;
            let gh = (h as f32 / p) as usize + 2;
            let lattice = (0..gw * gh).map(|_| rng.next_f64() as f32).collect();
            let axis = |n: u32| -> Vec<(usize, f32)> {
                (0..n)
                    .map(|i| {
                        let f = i as f32 / p;
                        (f as usize, smooth(f.fract()))
                    })
                    .collect()
            };
            out.push(Octave { lattice, stride: gw, xs: axis(w), ys: axis(h), amp });
            norm += amp;
            p = (p / 2.0).max(2.0);
            amp *= 0.5;
        }
        ValueNoise { octaves: out, norm }
    }

    /// Adds row `y` of the noise (scaled by `1 / norm`) into `row`.
    fn row(&self, y: usize, row: &mut [f32]) {
        row.fill(0.0);
        for o in &self.octaves {
            let Some(&(iy, ty)) = o.ys.get(y) else { continue };
            let (Some(r0), Some(r1)) = (
                o.lattice.get(iy * o.stride..(iy + 1) * o.stride),
                o.lattice.get((iy + 1) * o.stride..(iy + 2) * o.stride),
            ) else {
                continue;
            };
            let k = o.amp / self.norm;
            for (v, &(ix, tx)) in row.iter_mut().zip(&o.xs) {
                let (a, b) = (r0.get(ix).copied().unwrap_or(0.0), r0.get(ix + 1).copied().unwrap_or(0.0));
                let (c, d) = (r1.get(ix).copied().unwrap_or(0.0), r1.get(ix + 1).copied().unwrap_or(0.0));
                let top = a + (b - a) * tx;
                let bot = c + (d - c) * tx;
                *v += (top + (bot - top) * ty) * k;
            }
        }
    }
}

fn hsv(h: f64, s: f64, v: f64) -> [f32; 3] {
    let h = (h.rem_euclid(1.0)) * 6.0;
    let c = v * s;
    let x = c * (1.0 - ((h % 2.0) - 1.0).abs());
    let (r, g, b) = match h as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = v - c;
    [((r + m) * 255.0) as f32, ((g + m) * 255.0) as f32, ((b + m) * 255.0) as f32]
}

enum Shape {
    Ellipse { cx: f32, cy: f32, rx2: f32, ry2: f32 },
    Rect { x0: f32, y0: f32, x1: f32, y1: f32 },
}

impl Shape {
    fn contains(&self, x: f32, y: f32) -> bool {
        match *self {
            Shape::Ellipse { cx, cy, rx2, ry2 } => (x - cx) * (x - cx) / rx2 + (y - cy) * (y - cy) / ry2 <= 1.0,
            Shape::Rect { x0, y0, x1, y1 } => x >= x0 && x < x1 && y >= y0 && y < y1,
        }
    }
}

/// A photo-like RGB image, `width * height * 3` bytes, row-major HWC; the same seed and size always give
/// the same pixels.
pub fn photo(seed: u64, width: u32, height: u32) -> Vec<u8> {
    let (w, h) = (width as usize, height as usize);
    let mut rng = SplitMix64::new(mix(seed, 0xF070));
    let hue = rng.next_f64();
    let sky = [
        hsv(hue, rng.uniform(0.2, 0.6), rng.uniform(0.7, 1.0)),
        hsv(hue + 0.05, rng.uniform(0.1, 0.4), rng.uniform(0.8, 1.0)),
    ];
    let ground_hue = hue + rng.uniform(0.2, 0.6);
    let ground = [
        hsv(ground_hue, rng.uniform(0.3, 0.8), rng.uniform(0.3, 0.6)),
        hsv(ground_hue + 0.08, rng.uniform(0.4, 0.9), rng.uniform(0.15, 0.4)),
    ];
    let horizon = height as f32 * rng.uniform(0.3, 0.7) as f32;
    let scale = width.min(height).max(1) as f32;
    let period = scale / rng.uniform(4.0, 9.0) as f32;
    let texture = ValueNoise::new(&mut rng, width, height, period, 5);
    let light = ValueNoise::new(&mut rng, width, height, scale / 1.5, 2);
    let ridge = ValueNoise::new(&mut rng, width, 1, scale / 3.0, 3);

    let n_shapes = 3 + rng.below(6) as usize;
    let shapes: Vec<(Shape, [f32; 3], f32)> = (0..n_shapes)
        .map(|_| {
            let cx = rng.uniform(0.0, f64::from(width)) as f32;
            let cy = rng.uniform(0.0, f64::from(height)) as f32;
            let rx = (rng.uniform(0.05, 0.3) * f64::from(scale)) as f32;
            let ry = (rng.uniform(0.05, 0.3) * f64::from(scale)) as f32;
            let shape = if rng.below(2) == 0 {
                Shape::Ellipse { cx, cy, rx2: rx * rx, ry2: ry * ry }
            } else {
                Shape::Rect { x0: cx - rx, y0: cy - ry, x1: cx + rx, y1: cy + ry }
            };
            let color = hsv(rng.next_f64(), rng.uniform(0.3, 1.0), rng.uniform(0.3, 1.0));
            (shape, color, rng.uniform(0.2, 0.7) as f32)
        })
        .collect();

    let mut ridge_row = vec![0.0f32; w];
    ridge.row(0, &mut ridge_row);
    let mut tex = vec![0.0f32; w];
    let mut lit = vec![0.0f32; w];
    let grain_seed = mix(seed, 0x6A41);
    let mut out = vec![0u8; w * h * 3];
    for (y, row) in out.chunks_exact_mut(w * 3).enumerate() {
        texture.row(y, &mut tex);
        light.row(y, &mut lit);
        let fy = y as f32;
        let mut grain = SplitMix64::new(mix(grain_seed, y as u64));
        for (x, px) in row.chunks_exact_mut(3).enumerate() {
            let fx = x as f32;
            let t = tex.get(x).copied().unwrap_or(0.5);
            let edge = horizon + (ridge_row.get(x).copied().unwrap_or(0.5) - 0.5) * scale * 0.25;
            let mut color = if fy < edge {
                let k = (fy / edge.max(1.0)).clamp(0.0, 1.0);
                lerp3(sky[0], sky[1], k)
            } else {
                let k = ((fy - edge) / (height as f32 - edge).max(1.0)).clamp(0.0, 1.0);
                lerp3(ground[0], ground[1], k)
            };
            let mut contrast = 0.35;
            for (shape, c, tc) in &shapes {
                if shape.contains(fx, fy) {
                    color = *c;
                    contrast = *tc;
                }
            }
            let shade = (1.0 + (t - 0.5) * 2.0 * contrast) * (0.75 + 0.5 * lit.get(x).copied().unwrap_or(0.5));
            let g = grain.next_u64();
            for (i, (o, c)) in px.iter_mut().zip(color).enumerate() {
                let noise = ((g >> (i * 8)) & 0x0F) as f32 - 7.5;
                *o = (c * shade + noise).clamp(0.0, 255.0) as u8;
            }
        }
    }
    out
}

fn lerp3(a: [f32; 3], b: [f32; 3], t: f32) -> [f32; 3] {
    [a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t, a[2] + (b[2] - a[2]) * t]
}

fn check_pixels(pixels: &[u8], width: u32, height: u32) -> Result<()> {
    let expected = u64::from(width) * u64::from(height) * 3;
    if pixels.len() as u64 != expected || width == 0 || height == 0 {
        return Err(Error::InvalidOptions(format!(
            "{} bytes of pixels for a {width}x{height} RGB image (expected {expected}, non-empty)",
            pixels.len()
        )));
    }
    Ok(())
}

fn encode_error(format: &str, e: impl std::fmt::Display) -> Error {
    Error::InvalidOptions(format!("cannot encode {format}: {e}"))
}

/// Encodes RGB pixels as a JPEG with `quality` (1–100) and 4:2:0 chroma subsampling (what cameras and
/// libjpeg write), baseline or progressive.
pub fn encode_jpeg(pixels: &[u8], width: u32, height: u32, quality: u8, progressive: bool) -> Result<Vec<u8>> {
    check_pixels(pixels, width, height)?;
    let (w, h) = match (u16::try_from(width), u16::try_from(height)) {
        (Ok(w), Ok(h)) => (w, h),
        _ => return Err(Error::InvalidOptions(format!("JPEG cannot store {width}x{height} (65535 at most per side)"))),
    };
    let mut out = Vec::with_capacity(pixels.len() / 6);
    let mut enc = jpeg_encoder::Encoder::new(&mut out, quality.clamp(1, 100));
    enc.set_sampling_factor(jpeg_encoder::SamplingFactor::F_2_2);
    enc.set_progressive(progressive);
    enc.encode(pixels, w, h, jpeg_encoder::ColorType::Rgb).map_err(|e| encode_error("jpeg", e))?;
    Ok(out)
}

/// Encodes RGB pixels (`width * height * 3` bytes) in `format`: JPEG at [`JPEG_QUALITY`], lossless WebP,
/// GIF with a 256-color palette, and PNG, BMP, TIFF as they are.
pub fn encode(pixels: &[u8], width: u32, height: u32, format: ImageFormat) -> Result<Vec<u8>> {
    check_pixels(pixels, width, height)?;
    let mut out = Vec::new();
    let rgb = image::ExtendedColorType::Rgb8;
    let name = format.name();
    match format {
        ImageFormat::Jpeg => return encode_jpeg(pixels, width, height, JPEG_QUALITY, false),
        ImageFormat::Png => image::codecs::png::PngEncoder::new(&mut out).write_image(pixels, width, height, rgb),
        ImageFormat::Webp => {
            image::codecs::webp::WebPEncoder::new_lossless(&mut out).write_image(pixels, width, height, rgb)
        }
        ImageFormat::Gif => {
            image::codecs::gif::GifEncoder::new_with_speed(&mut out, 10).encode(pixels, width, height, rgb)
        }
        ImageFormat::Bmp => image::codecs::bmp::BmpEncoder::new(&mut out).write_image(pixels, width, height, rgb),
        ImageFormat::Tiff => {
            image::codecs::tiff::TiffEncoder::new(Cursor::new(&mut out)).write_image(pixels, width, height, rgb)
        }
    }
    .map_err(|e| encode_error(name, e))?;
    Ok(out)
}

/// True if `path` holds a complete JPEG of the expected size (so [`write_dataset`] can skip it).
fn is_done(path: &Path, width: u32, height: u32) -> bool {
    match std::fs::read(path) {
        Ok(bytes) => {
            crate::image::image_info(&bytes, "").is_ok_and(|i| (i.width, i.height) == (width, height))
                && bytes.ends_with(&[0xFF, 0xD9])
        }
        Err(_) => false,
    }
}

/// Writes `n` photo-like JPEGs as an ImageNet-style tree, `dir/class_XXX/img_YYYYY.jpg` (image `i` in
/// class `i % classes`), and returns their paths in order.
///
/// Deterministic in `seed`; idempotent: a file that already holds a complete JPEG of the expected size
/// is kept, others are written to a temporary name and renamed, so an interrupted run leaves no partial
/// files. Uses every core.
pub fn write_dataset(dir: &Path, n: usize, seed: u64, classes: usize) -> Result<Vec<PathBuf>> {
    if classes == 0 {
        return Err(Error::InvalidOptions("a dataset needs at least one class".into()));
    }
    let paths: Vec<PathBuf> =
        (0..n).map(|i| dir.join(format!("class_{:03}", i % classes)).join(format!("img_{i:05}.jpg"))).collect();
    for c in 0..classes.min(n) {
        let d = dir.join(format!("class_{c:03}"));
        std::fs::create_dir_all(&d).map_err(|source| Error::Io { path: d, source })?;
    }
    let next = AtomicUsize::new(0);
    let first_error: Mutex<Option<(usize, Error)>> = Mutex::new(None);
    let work = || {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(path) = paths.get(i) else { break };
            if let Err(e) = write_one(path, mix(seed, i as u64)) {
                let mut slot = first_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if slot.as_ref().is_none_or(|(j, _)| i < *j) {
                    *slot = Some((i, e));
                }
                break;
            }
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get()).min(n).max(1);
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(work);
        }
        work();
    });
    match first_error.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
        Some((_, e)) => Err(e),
        None => Ok(paths),
    }
}

fn write_one(path: &Path, seed: u64) -> Result<()> {
    let (w, h) = photo_size(seed);
    if is_done(path, w, h) {
        return Ok(());
    }
    let jpeg = encode_jpeg(&photo(seed, w, h), w, h, JPEG_QUALITY, false)?;
    let file_name = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, &jpeg).map_err(|source| Error::Io { path: tmp.clone(), source })?;
    std::fs::rename(&tmp, path).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        Error::Io { path: path.to_owned(), source }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_look_like_imagenet() {
        let sizes: Vec<_> = (0..1000).map(photo_size).collect();
        let common = sizes.iter().filter(|&&s| s == (500, 375)).count();
        assert!((400..600).contains(&common), "{common}");
        assert!(sizes.iter().all(|&(w, h)| (350..=640).contains(&w) && (260..=500).contains(&h)));
        assert_eq!(photo_size(5), photo_size(5));
    }

    #[test]
    fn photos_are_textured_not_flat() {
        let (w, h) = (200u32, 150u32);
        let p = photo(3, w, h);
        assert_eq!(p.len(), (w * h * 3) as usize);
        assert_ne!(p, photo(4, w, h));
        let mean = p.iter().map(|&v| f64::from(v)).sum::<f64>() / p.len() as f64;
        let var = p.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / p.len() as f64;
        assert!(var.sqrt() > 20.0, "std {}", var.sqrt());
        // Neighbouring pixels differ (texture and grain), but mostly a little (smooth regions).
        let diffs: Vec<i32> = p.windows(4).step_by(3).map(|x| (i32::from(x[0]) - i32::from(x[3])).abs()).collect();
        let moving = diffs.iter().filter(|&&d| d > 0).count() as f64 / diffs.len() as f64;
        let small = diffs.iter().filter(|&&d| d < 24).count() as f64 / diffs.len() as f64;
        assert!(moving > 0.5 && small > 0.9, "moving {moving} small {small}");
    }

    #[test]
    fn bad_pixel_counts_are_errors() {
        assert!(encode(&[0; 5], 2, 1, ImageFormat::Png).is_err());
        assert!(encode_jpeg(&[0; 3 * 70_000], 70_000, 1, 90, false).is_err());
        assert!(write_dataset(Path::new("/nonexistent"), 1, 0, 0).is_err());
    }
}
