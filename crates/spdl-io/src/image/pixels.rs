//! Pixel buffers and the per-pixel passes: channel conversion, EXIF orientation, the batch write
//! (HWC/CHW, u8 or normalized f32) and the resampling call.

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{PixelType, ResizeOptions, Resizer};
use image::metadata::Orientation;
use spdl_buffer::{Buffer, BufferError, DType, Layout, SharedAllocator};

use crate::image::transform::{Plan, ResizeFilter};
use crate::{Error, Result};

/// Where a decoder writes its final interleaved 8-bit pixels: a reusable `Vec` (batch workers) or a
/// [`Buffer`] from the caller's allocator (single-image decode without a transform: no copy afterwards).
pub(crate) trait PixelStore {
    fn slice(&mut self, width: u32, height: u32, channels: u8) -> Result<&mut [u8]>;
}

pub(crate) fn byte_len(width: u32, height: u32, channels: u8) -> Result<usize> {
    usize::try_from(u64::from(width) * u64::from(height) * u64::from(channels)).map_err(|_| {
        Error::Buffer(BufferError::SizeOverflow { shape: vec![height as usize, width as usize, channels.into()] })
    })
}

/// Grows `v` to `len` bytes, reporting allocation failure as an error instead of aborting.
pub(crate) fn sized(v: &mut Vec<u8>, len: usize) -> Result<&mut [u8]> {
    v.clear();
    v.try_reserve_exact(len).map_err(|e| {
        Error::Buffer(BufferError::OutOfMemory { allocator: "system".into(), bytes: len, cause: e.to_string() })
    })?;
    v.resize(len, 0);
    Ok(v.as_mut_slice())
}

impl PixelStore for Vec<u8> {
    fn slice(&mut self, width: u32, height: u32, channels: u8) -> Result<&mut [u8]> {
        let len = byte_len(width, height, channels)?;
        sized(self, len)
    }
}

/// Allocates the output [`Buffer`] (HWC, u8) on first use.
#[derive(Debug)]
pub(crate) struct BufferStore<'a> {
    pub(crate) allocator: &'a SharedAllocator,
    pub(crate) buffer: Option<Buffer>,
}

impl PixelStore for BufferStore<'_> {
    fn slice(&mut self, width: u32, height: u32, channels: u8) -> Result<&mut [u8]> {
        let shape = [height as usize, width as usize, usize::from(channels)];
        let buf = Buffer::zeros(DType::U8, &shape, Layout::Hwc, self.allocator)?;
        Ok(self.buffer.insert(buf).as_bytes_mut())
    }
}

/// Decoded, interleaved 8-bit pixels held in a reusable `Vec`.
#[derive(Debug, Default)]
pub(crate) struct Pixels {
    pub(crate) data: Vec<u8>,
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) channels: u8,
}

impl Pixels {
    pub(crate) fn view(&self, item: &str) -> Result<ImageRef<'_>> {
        ImageRef::new(self.width, self.height, &self.data, pixel_type(self.channels)?)
            .map_err(|e| resize_error(item, e))
    }
}

pub(crate) fn pixel_type(channels: u8) -> Result<PixelType> {
    match channels {
        1 => Ok(PixelType::U8),
        2 => Ok(PixelType::U8x2),
        3 => Ok(PixelType::U8x3),
        4 => Ok(PixelType::U8x4),
        c => Err(Error::InvalidOptions(format!("{c} channels per pixel are not supported"))),
    }
}

/// A resampling failure (a crop outside the image or a wrongly sized buffer: a bug, never the data's fault).
fn resize_error(item: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Decode { item: item.to_owned(), format: "resize".into(), cause: Box::new(e) }
}

/// The dimensions after an orientation is applied.
pub(crate) fn oriented_dims(o: Orientation, w: u32, h: u32) -> (u32, u32) {
    match o {
        Orientation::Rotate90 | Orientation::Rotate270 | Orientation::Rotate90FlipH | Orientation::Rotate270FlipH => {
            (h, w)
        }
        _ => (w, h),
    }
}

/// ITU-R BT.601 luma (JPEG's Y, Pillow's `convert("L")`), in fixed point.
#[inline]
fn luma(r: u8, g: u8, b: u8) -> u8 {
    ((19595 * u32::from(r) + 38470 * u32::from(g) + 7471 * u32::from(b) + 32768) >> 16) as u8
}

#[inline]
fn convert_pixel(src: &[u8], dst: &mut [u8]) {
    match (src, dst) {
        ([v], [o]) | ([v, _], [o]) => *o = *v,
        ([v], [r, g, b]) | ([v, _], [r, g, b]) => (*r, *g, *b) = (*v, *v, *v),
        ([v], [r, g, b, a]) => (*r, *g, *b, *a) = (*v, *v, *v, 255),
        ([v, al], [r, g, b, a]) => (*r, *g, *b, *a) = (*v, *v, *v, *al),
        ([r, g, b], [o]) | ([r, g, b, _], [o]) => *o = luma(*r, *g, *b),
        ([r, g, b], [or, og, ob]) | ([r, g, b, _], [or, og, ob]) => (*or, *og, *ob) = (*r, *g, *b),
        ([r, g, b], [or, og, ob, oa]) => (*or, *og, *ob, *oa) = (*r, *g, *b, 255),
        (s, d) => d.copy_from_slice(&s[..d.len().min(s.len())]),
    }
}

/// Converts `src` (`w` x `h`, `cin` channels, stored orientation) into `dst` (`cout` channels, oriented).
/// One pass; `dst` must hold `w * h * cout` bytes.
pub(crate) fn remap(src: &[u8], w: u32, h: u32, cin: u8, o: Orientation, dst: &mut [u8], cout: u8) {
    let (w, h, cin, cout) = (w as usize, h as usize, usize::from(cin), usize::from(cout));
    if o == Orientation::NoTransforms {
        if cin == cout {
            dst.copy_from_slice(src);
        } else {
            for (s, d) in src.chunks_exact(cin).zip(dst.chunks_exact_mut(cout)) {
                convert_pixel(s, d);
            }
        }
        return;
    }
    let (ow, _) = oriented_dims(o, w as u32, h as u32);
    let ow = ow as usize;
    // For each source pixel (x, y), where it lands in the oriented image.
    let target = |x: usize, y: usize| -> (usize, usize) {
        match o {
            Orientation::NoTransforms => (x, y),
            Orientation::FlipHorizontal => (w - 1 - x, y),
            Orientation::FlipVertical => (x, h - 1 - y),
            Orientation::Rotate180 => (w - 1 - x, h - 1 - y),
            Orientation::Rotate90 => (h - 1 - y, x),
            Orientation::Rotate270 => (y, w - 1 - x),
            Orientation::Rotate90FlipH => (y, x),
            Orientation::Rotate270FlipH => (h - 1 - y, w - 1 - x),
        }
    };
    for (y, row) in src.chunks_exact(w * cin).enumerate().take(h) {
        for (x, s) in row.chunks_exact(cin).enumerate() {
            let (tx, ty) = target(x, y);
            let at = (ty * ow + tx) * cout;
            if let Some(d) = dst.get_mut(at..at + cout) {
                convert_pixel(s, d);
            }
        }
    }
}

/// Resamples the plan's crop of `src` into `dst` (`plan.out_w` x `plan.out_h`, same channels).
pub(crate) fn resize_into(
    resizer: &mut Resizer,
    src: &Pixels,
    plan: &Plan,
    filter: ResizeFilter,
    dst: &mut [u8],
    item: &str,
) -> Result<()> {
    let pt = pixel_type(src.channels)?;
    if plan.is_identity(src.width, src.height) {
        let n = src.data.len().min(dst.len());
        dst[..n].copy_from_slice(&src.data[..n]);
        return Ok(());
    }
    let view = src.view(item)?;
    let mut out = Image::from_slice_u8(plan.out_w, plan.out_h, dst, pt).map_err(|e| resize_error(item, e))?;
    let opts = ResizeOptions::new()
        .resize_alg(filter.algorithm())
        .crop(plan.left, plan.top, plan.width, plan.height)
        // Alpha is resampled as a plain channel: premultiplying changes the RGB of transparent pixels,
        // which a training loader should pass through as decoded.
        .use_alpha(false);
    resizer.resize(&view, &mut out, &opts).map_err(|e| resize_error(item, e))?;
    if plan.flip {
        flip_rows(dst, plan.out_w as usize, usize::from(src.channels));
    }
    Ok(())
}

/// Mirrors each row of an interleaved image (`width` pixels of `channels` bytes) left to right, in place.
fn flip_rows(px: &mut [u8], width: usize, channels: usize) {
    let row = width * channels;
    if row == 0 {
        return;
    }
    for r in px.chunks_exact_mut(row) {
        let (mut i, mut j) = (0, width.saturating_sub(1));
        while i < j {
            let (a, b) = r.split_at_mut(j * channels);
            a[i * channels..(i + 1) * channels].swap_with_slice(&mut b[..channels]);
            i += 1;
            j -= 1;
        }
    }
}

/// Per-channel normalization `(v / 255 - mean) / std` as a lookup table (one add in the hot loop).
#[derive(Debug, Clone)]
pub(crate) struct NormalizeLut {
    tables: Vec<[f32; 256]>,
}

impl NormalizeLut {
    pub(crate) fn new(mean: &[f32], std: &[f32], channels: u8) -> NormalizeLut {
        let tables = (0..usize::from(channels))
            .map(|c| {
                let m = mean.get(c).or(mean.first()).copied().unwrap_or(0.0);
                let s = std.get(c).or(std.first()).copied().unwrap_or(1.0);
                std::array::from_fn(|v| (v as f32 / 255.0 - m) / s)
            })
            .collect();
        NormalizeLut { tables }
    }
}

/// Writes interleaved `src` (`channels` per pixel) into a batch slot.
pub(crate) enum SlotMut<'a> {
    U8Hwc(&'a mut [u8]),
    U8Chw(&'a mut [u8]),
    F32Hwc(&'a mut [f32], &'a NormalizeLut),
    F32Chw(&'a mut [f32], &'a NormalizeLut),
}

impl SlotMut<'_> {
    pub(crate) fn zero(&mut self) {
        match self {
            SlotMut::U8Hwc(s) | SlotMut::U8Chw(s) => s.fill(0),
            SlotMut::F32Hwc(s, _) | SlotMut::F32Chw(s, _) => s.fill(0.0),
        }
    }

    /// The slot as interleaved u8 pixels, if it is one (the resampler writes there directly).
    pub(crate) fn direct(&mut self) -> Option<&mut [u8]> {
        match self {
            SlotMut::U8Hwc(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn write(&mut self, src: &[u8], channels: u8) {
        let c = usize::from(channels);
        match self {
            SlotMut::U8Hwc(dst) => {
                let n = src.len().min(dst.len());
                dst[..n].copy_from_slice(&src[..n]);
            }
            SlotMut::U8Chw(dst) => {
                let plane = dst.len() / c.max(1);
                for (ci, out) in dst.chunks_exact_mut(plane.max(1)).enumerate().take(c) {
                    for (o, px) in out.iter_mut().zip(src.chunks_exact(c)) {
                        *o = px.get(ci).copied().unwrap_or(0);
                    }
                }
            }
            SlotMut::F32Hwc(dst, lut) => {
                for (o, px) in dst.chunks_exact_mut(c).zip(src.chunks_exact(c)) {
                    for ((v, s), t) in o.iter_mut().zip(px).zip(&lut.tables) {
                        *v = t[usize::from(*s)];
                    }
                }
            }
            SlotMut::F32Chw(dst, lut) => {
                let plane = dst.len() / c.max(1);
                for (ci, (out, t)) in dst.chunks_exact_mut(plane.max(1)).zip(&lut.tables).enumerate() {
                    for (o, px) in out.iter_mut().zip(src.chunks_exact(c)) {
                        *o = t[usize::from(px.get(ci).copied().unwrap_or(0))];
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(w: u32, h: u32) -> Vec<u8> {
        (0..w * h).flat_map(|i| [i as u8, (i * 2) as u8, (i * 3) as u8]).collect()
    }

    #[test]
    fn orientation_matches_the_image_crate() {
        let (w, h) = (5u32, 3u32);
        let src = img(w, h);
        for o in [
            Orientation::NoTransforms,
            Orientation::Rotate90,
            Orientation::Rotate180,
            Orientation::Rotate270,
            Orientation::FlipHorizontal,
            Orientation::FlipVertical,
            Orientation::Rotate90FlipH,
            Orientation::Rotate270FlipH,
        ] {
            let mut reference = image::DynamicImage::ImageRgb8(image::RgbImage::from_raw(w, h, src.clone()).unwrap());
            reference.apply_orientation(o);
            let (ow, oh) = oriented_dims(o, w, h);
            assert_eq!((reference.width(), reference.height()), (ow, oh), "{o:?}");
            let mut dst = vec![0; src.len()];
            remap(&src, w, h, 3, o, &mut dst, 3);
            assert_eq!(dst, reference.into_rgb8().into_raw(), "{o:?}");
        }
    }

    #[test]
    fn channel_conversions() {
        let mut d = [0u8; 1];
        convert_pixel(&[255, 255, 255], &mut d);
        assert_eq!(d, [255]);
        convert_pixel(&[255, 0, 0], &mut d);
        assert_eq!(d, [76]); // 0.299 * 255
        let mut d = [0u8; 4];
        convert_pixel(&[9], &mut d);
        assert_eq!(d, [9, 9, 9, 255]);
        convert_pixel(&[9, 7], &mut d);
        assert_eq!(d, [9, 9, 9, 7]);
        let mut d = [0u8; 3];
        convert_pixel(&[1, 2, 3, 4], &mut d);
        assert_eq!(d, [1, 2, 3]);
    }

    #[test]
    fn slot_writes() {
        let src = [1u8, 2, 3, 4, 5, 6];
        let mut chw = [0u8; 6];
        SlotMut::U8Chw(&mut chw).write(&src, 3);
        assert_eq!(chw, [1, 4, 2, 5, 3, 6]);
        let lut = NormalizeLut::new(&[0.0, 0.5, 0.0], &[1.0, 0.5, 2.0], 3);
        let mut f = [0f32; 6];
        SlotMut::F32Chw(&mut f, &lut).write(&src, 3);
        assert!((f[0] - 1.0 / 255.0).abs() < 1e-6);
        assert!((f[2] - (2.0 / 255.0 - 0.5) / 0.5).abs() < 1e-6);
        assert!((f[5] - 6.0 / 255.0 / 2.0).abs() < 1e-6);
        let mut f = [0f32; 6];
        SlotMut::F32Hwc(&mut f, &lut).write(&src, 3);
        assert!((f[1] - (2.0 / 255.0 - 0.5) / 0.5).abs() < 1e-6);
    }
}
