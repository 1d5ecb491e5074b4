//! Encoding images (SPDL's `encode_image`/`save_image`): JPEG, PNG, WebP (lossless), BMP, TIFF and GIF
//! through the `image` crate, chosen by the file extension.

use std::io::Cursor;
use std::path::Path;

use image::ImageEncoder;

use crate::{Error, Result};

/// The pixel layout of the data to encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeColor {
    /// `[H, W, 3]` `u8` RGB.
    Rgb8,
    /// `[H, W, 4]` `u8` RGBA.
    Rgba8,
    /// `[H, W]` `u8` gray.
    Gray8,
    /// `[H, W]` `u16` gray (native-endian bytes).
    Gray16,
}

impl EncodeColor {
    fn bytes_per_pixel(self) -> usize {
        match self {
            EncodeColor::Rgb8 => 3,
            EncodeColor::Rgba8 => 4,
            EncodeColor::Gray8 => 1,
            EncodeColor::Gray16 => 2,
        }
    }

    fn extended(self) -> image::ExtendedColorType {
        match self {
            EncodeColor::Rgb8 => image::ExtendedColorType::Rgb8,
            EncodeColor::Rgba8 => image::ExtendedColorType::Rgba8,
            EncodeColor::Gray8 => image::ExtendedColorType::L8,
            EncodeColor::Gray16 => image::ExtendedColorType::L16,
        }
    }
}

/// Encoder settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct EncodeOptions {
    /// JPEG quality, 1 (worst) to 100 (best); default 90.
    pub quality: Option<u8>,
    /// PNG compression: 0-3 fast, 4-6 default, 7-9 best; default: the encoder's.
    pub compression: Option<u8>,
}

fn encode_error(format: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Decode { item: "<encode>".into(), format: format.to_owned(), cause: Box::new(e) }
}

/// Encodes `pixels` (`height` rows of `width` pixels of `color`, tightly packed) in the format that the
/// extension of `path` names.
///
/// ```
/// use spdl_io::image::{EncodeColor, EncodeOptions, encode_image};
/// use std::path::Path;
///
/// let png = encode_image(&[0u8; 4 * 2 * 3], 4, 2, EncodeColor::Rgb8, Path::new("x.png"), &EncodeOptions::default())?;
/// assert_eq!(&png[1..4], b"PNG");
/// # Ok::<(), spdl_io::Error>(())
/// ```
///
/// Errors: [`Error::InvalidOptions`] (a size that does not match the data, an unknown extension, a pixel
/// layout the format cannot hold).
pub fn encode_image(
    pixels: &[u8],
    width: u32,
    height: u32,
    color: EncodeColor,
    path: &Path,
    opts: &EncodeOptions,
) -> Result<Vec<u8>> {
    let expected = (width as usize).checked_mul(height as usize).and_then(|n| n.checked_mul(color.bytes_per_pixel()));
    if width == 0 || height == 0 || expected != Some(pixels.len()) {
        return Err(Error::InvalidOptions(format!(
            "encode_image: {} bytes of data for a {width}x{height} {color:?} image",
            pixels.len()
        )));
    }
    let format = image::ImageFormat::from_path(path).map_err(|_| {
        Error::InvalidOptions(format!(
            "encode_image: {}: the extension names no image format this build encodes (jpg, png, webp, bmp, \
             tiff, gif)",
            path.display()
        ))
    })?;
    let mut out = Vec::new();
    let ct = color.extended();
    match format {
        image::ImageFormat::Jpeg => {
            if color == EncodeColor::Gray16 || color == EncodeColor::Rgba8 {
                return Err(Error::InvalidOptions(format!("encode_image: JPEG cannot hold {color:?} pixels")));
            }
            let q = opts.quality.unwrap_or(90).clamp(1, 100);
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, q)
                .write_image(pixels, width, height, ct)
                .map_err(|e| encode_error("jpeg", e))?;
        }
        image::ImageFormat::Png => {
            use image::codecs::png::{CompressionType, FilterType, PngEncoder};
            let c = match opts.compression {
                None => CompressionType::Default,
                Some(0..=3) => CompressionType::Fast,
                Some(4..=6) => CompressionType::Default,
                Some(_) => CompressionType::Best,
            };
            PngEncoder::new_with_quality(&mut out, c, FilterType::Adaptive)
                .write_image(pixels, width, height, ct)
                .map_err(|e| encode_error("png", e))?;
        }
        other => {
            let mut cur = Cursor::new(&mut out);
            image::write_buffer_with_format(&mut cur, pixels, width, height, ct, other)
                .map_err(|e| encode_error(other.extensions_str().first().copied().unwrap_or("image"), e))?;
        }
    }
    Ok(out)
}
