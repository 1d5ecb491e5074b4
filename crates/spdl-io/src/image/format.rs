//! Image container formats, recognised by their magic bytes (never by a file extension).

use std::fmt;

use crate::{Error, Result};

/// An image container format this crate decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ImageFormat {
    /// JPEG / JFIF / EXIF (baseline and progressive).
    Jpeg,
    /// PNG (1–16 bit, palette, alpha).
    Png,
    /// WebP (lossy and lossless; first frame of an animation).
    Webp,
    /// GIF (first frame).
    Gif,
    /// Windows bitmap.
    Bmp,
    /// TIFF (first page).
    Tiff,
}

impl ImageFormat {
    /// Every format, in detection order.
    pub const ALL: [ImageFormat; 6] =
        [ImageFormat::Jpeg, ImageFormat::Png, ImageFormat::Webp, ImageFormat::Gif, ImageFormat::Bmp, ImageFormat::Tiff];

    /// A short lowercase name (`"jpeg"`, `"png"`, ...), as used in errors.
    pub const fn name(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "jpeg",
            ImageFormat::Png => "png",
            ImageFormat::Webp => "webp",
            ImageFormat::Gif => "gif",
            ImageFormat::Bmp => "bmp",
            ImageFormat::Tiff => "tiff",
        }
    }

    /// The usual file extension, without the dot.
    pub const fn extension(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "jpg",
            ImageFormat::Png => "png",
            ImageFormat::Webp => "webp",
            ImageFormat::Gif => "gif",
            ImageFormat::Bmp => "bmp",
            ImageFormat::Tiff => "tiff",
        }
    }

    /// Recognises the format from the first bytes of the data, or `None`.
    ///
    /// ```
    /// use spdl_io::image::ImageFormat;
    /// assert_eq!(ImageFormat::detect(b"\x89PNG\r\n\x1a\n...."), Some(ImageFormat::Png));
    /// assert_eq!(ImageFormat::detect(b"<html>"), None);
    /// ```
    pub fn detect(bytes: &[u8]) -> Option<ImageFormat> {
        match bytes {
            [0xFF, 0xD8, 0xFF, ..] => Some(ImageFormat::Jpeg),
            [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A, ..] => Some(ImageFormat::Png),
            [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => Some(ImageFormat::Webp),
            [b'G', b'I', b'F', b'8', b'7' | b'9', b'a', ..] => Some(ImageFormat::Gif),
            [b'B', b'M', ..] => Some(ImageFormat::Bmp),
            [b'I', b'I', 42, 0, ..] | [b'M', b'M', 0, 42, ..] => Some(ImageFormat::Tiff),
            _ => None,
        }
    }

    pub(crate) fn to_image_crate(self) -> image::ImageFormat {
        match self {
            ImageFormat::Jpeg => image::ImageFormat::Jpeg,
            ImageFormat::Png => image::ImageFormat::Png,
            ImageFormat::Webp => image::ImageFormat::WebP,
            ImageFormat::Gif => image::ImageFormat::Gif,
            ImageFormat::Bmp => image::ImageFormat::Bmp,
            ImageFormat::Tiff => image::ImageFormat::Tiff,
        }
    }
}

impl fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Detects the format of `bytes`, with the errors a caller needs: empty input, or an unknown signature
/// (reported with the first bytes and what the name's extension claims).
pub(crate) fn detect_or_error(bytes: &[u8], item: &str) -> Result<ImageFormat> {
    if bytes.is_empty() {
        return Err(Error::Empty { item: item.to_owned() });
    }
    ImageFormat::detect(bytes)
        .ok_or_else(|| Error::UnknownFormat { item: item.to_owned(), detail: describe(bytes, item) })
}

fn describe(bytes: &[u8], item: &str) -> String {
    let head: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let mut detail = format!(
        "{} bytes starting {}, not the signature of JPEG, PNG, WebP, GIF, BMP or TIFF",
        bytes.len(),
        head.join(" ")
    );
    if let Some((_, ext)) = item.rsplit_once('.')
        && !ext.contains('/')
        && ext.len() <= 5
    {
        detail.push_str(&format!("; the name says .{ext}, but the format is taken from the bytes"));
    }
    detail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_bytes() {
        assert_eq!(ImageFormat::detect(&[0xFF, 0xD8, 0xFF, 0xE0]), Some(ImageFormat::Jpeg));
        assert_eq!(ImageFormat::detect(b"GIF89a\x01\x00"), Some(ImageFormat::Gif));
        assert_eq!(ImageFormat::detect(b"GIF87a"), Some(ImageFormat::Gif));
        assert_eq!(ImageFormat::detect(b"RIFF\0\0\0\0WEBPVP8 "), Some(ImageFormat::Webp));
        assert_eq!(ImageFormat::detect(b"RIFF\0\0\0\0WAVEfmt "), None);
        assert_eq!(ImageFormat::detect(b"II*\0"), Some(ImageFormat::Tiff));
        assert_eq!(ImageFormat::detect(b"MM\0*"), Some(ImageFormat::Tiff));
        assert_eq!(ImageFormat::detect(b"BM"), Some(ImageFormat::Bmp));
        assert_eq!(ImageFormat::detect(&[0xFF, 0xD8]), None);
        assert_eq!(ImageFormat::detect(b""), None);
    }

    #[test]
    fn errors_name_the_item() {
        match detect_or_error(b"", "a.jpg") {
            Err(Error::Empty { item }) => assert_eq!(item, "a.jpg"),
            other => panic!("{other:?}"),
        }
        match detect_or_error(b"<!DOCTYPE html>", "cat.jpg") {
            Err(e @ Error::UnknownFormat { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("cat.jpg") && msg.contains("3c 21 44 4f") && msg.contains(".jpg"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
    }
}
