//! Format-aware corruptions: header fields set to absurd values (dimensions, sample rates, channel counts,
//! durations, table sizes, chunk lengths) and decompression bombs. Each patch finds its field in the seed
//! and is skipped (not an error) when the seed does not have it, so a new encoder version cannot break the
//! generator.

use super::{Expect, Variant};

/// Header variants of the seed `bytes` in `format`.
pub(crate) fn variants(format: &str, bytes: &[u8]) -> Vec<Variant> {
    let mut v = Vec::new();
    match format {
        "jpeg" | "jpeg-progressive" => jpeg(bytes, &mut v),
        "png" => png(bytes, &mut v),
        "gif" => gif(bytes, &mut v),
        "bmp" => bmp(bytes, &mut v),
        "tiff" => tiff(bytes, &mut v),
        "webp" => webp(bytes, &mut v),
        "wav" => wav(bytes, &mut v),
        "flac" => flac(bytes, &mut v),
        "mp3" => mp3(bytes, &mut v),
        "ogg" => ogg(bytes, &mut v),
        "aac" => adts(bytes, &mut v),
        "m4a" | "mp4" => isobmff(bytes, &mut v),
        "mkv" | "webm" => matroska(bytes, &mut v),
        _ => {}
    }
    v
}

/// Decompression bombs that are not patches of a seed (PNG only: deflate makes them tiny).
pub(crate) fn bombs() -> Vec<Variant> {
    vec![
        Variant::new(
            "bomb",
            "png-over-limit",
            "PNG header says 20000x20000 (400 Mpx, over the 179 Mpx default limit); 256 rows of deflated zeros",
            png_zero_image(20_000, 20_000, 256),
            Expect::Error,
        ),
        Variant::new(
            "bomb",
            "png-under-limit",
            "valid 4096x4096 gray PNG of zeros: ~100 KB that inflate to 16 MiB (50 MiB as RGB), under the limit",
            png_zero_image(4096, 4096, 4096),
            Expect::Ok,
        ),
    ]
}

// ---------------------------------------------------------------------------------------------------------
// byte helpers (all bounds-checked: a patch that does not fit is skipped)

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|p| p + from)
}

/// A copy of `bytes` with `new` written at `at`, or `None` if it does not fit.
fn patched(bytes: &[u8], at: usize, new: &[u8]) -> Option<Vec<u8>> {
    let mut out = bytes.to_vec();
    out.get_mut(at..at.checked_add(new.len())?)?.copy_from_slice(new);
    Some(out)
}

/// Adds a header variant if the patch fits.
fn push(v: &mut Vec<Variant>, kind: &'static str, name: &str, detail: &str, bytes: Option<Vec<u8>>, expect: Expect) {
    if let Some(bytes) = bytes {
        v.push(Variant::new(kind, name, detail, bytes, expect));
    }
}

fn u16_at_be(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at_be(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u32_at_le(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u16_at_le(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

// ---------------------------------------------------------------------------------------------------------
// images

fn jpeg(b: &[u8], v: &mut Vec<Variant>) {
    // The frame header: FF C0 (baseline) or FF C2 (progressive), length, precision, height, width, components.
    let sof = find(b, &[0xFF, 0xC0], 2).or_else(|| find(b, &[0xFF, 0xC2], 2));
    let Some(sof) = sof else { return };
    let dims = |h: u16, w: u16| {
        let mut d = h.to_be_bytes().to_vec();
        d.extend_from_slice(&w.to_be_bytes());
        patched(b, sof + 5, &d)
    };
    push(v, "bomb", "sof-65535x65535", "SOF says 65535x65535 (4.3 Gpx)", dims(65535, 65535), Expect::Error);
    push(
        v,
        "bomb",
        "sof-20000x10000",
        "SOF says 20000x10000 (200 Mpx, just over the limit)",
        dims(10_000, 20_000),
        Expect::Error,
    );
    push(
        v,
        "bomb",
        "sof-4000x4000",
        "SOF says 4000x4000 (16 Mpx, under the limit) over 96x72 of entropy data",
        dims(4000, 4000),
        Expect::Any,
    );
    push(v, "header", "sof-height-0", "SOF height 0 (a DNL marker is never sent)", dims(0, 96), Expect::Error);
    push(v, "header", "sof-width-0", "SOF width 0", dims(72, 0), Expect::Error);
    push(v, "header", "sof-0-components", "SOF says 0 color components", patched(b, sof + 9, &[0]), Expect::Error);
    push(
        v,
        "header",
        "sof-255-components",
        "SOF says 255 color components",
        patched(b, sof + 9, &[255]),
        Expect::Error,
    );
    push(v, "header", "sof-precision-12", "SOF sample precision 12 bits", patched(b, sof + 4, &[12]), Expect::Any);
    push(v, "header", "sof-length-0", "SOF segment length 0", patched(b, sof + 2, &[0, 0]), Expect::Error);
    if let Some(dqt) = find(b, &[0xFF, 0xDB], 2) {
        push(
            v,
            "header",
            "dqt-length-ffff",
            "DQT segment length 65535 (past the end)",
            patched(b, dqt + 2, &[0xFF, 0xFF]),
            Expect::Error,
        );
    }
    if let Some(dht) = find(b, &[0xFF, 0xC4], 2) {
        // The 16 code-length counts: all 255 claims 4080 codes (at most 256 fit).
        push(
            v,
            "header",
            "dht-counts-255",
            "DHT claims 255 codes of every length",
            patched(b, dht + 5, &[0xFF; 16]),
            Expect::Any,
        );
    }
}

/// CRC-32 (ISO-HDLC), as PNG chunks use.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

fn png_chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(out.get(start..).unwrap_or_default());
    out.extend_from_slice(&crc.to_be_bytes());
}

/// The IHDR of the seed with the 13 data bytes changed by `edit`, the CRC recomputed when `fix_crc`.
fn png_ihdr(b: &[u8], edit: impl FnOnce(&mut [u8]), fix_crc: bool) -> Option<Vec<u8>> {
    if b.get(12..16)? != b"IHDR" {
        return None;
    }
    let mut out = b.to_vec();
    edit(out.get_mut(16..29)?);
    if fix_crc {
        let crc = crc32(out.get(12..29)?);
        out.get_mut(29..33)?.copy_from_slice(&crc.to_be_bytes());
    }
    Some(out)
}

fn png(b: &[u8], v: &mut Vec<Variant>) {
    let dims = |w: u32, h: u32| {
        move |d: &mut [u8]| {
            if let Some(s) = d.get_mut(0..4) {
                s.copy_from_slice(&w.to_be_bytes());
            }
            if let Some(s) = d.get_mut(4..8) {
                s.copy_from_slice(&h.to_be_bytes());
            }
        }
    };
    let byte = |at: usize, val: u8| {
        move |d: &mut [u8]| {
            if let Some(x) = d.get_mut(at) {
                *x = val;
            }
        }
    };
    push(
        v,
        "bomb",
        "ihdr-100000x100000",
        "IHDR says 100000x100000 (10 Gpx), CRC fixed",
        png_ihdr(b, dims(100_000, 100_000), true),
        Expect::Error,
    );
    push(
        v,
        "bomb",
        "ihdr-2^31-wide",
        "IHDR width 2^31-1 (the PNG maximum), CRC fixed",
        png_ihdr(b, dims(0x7FFF_FFFF, 72), true),
        Expect::Error,
    );
    push(v, "header", "ihdr-width-0", "IHDR width 0, CRC fixed", png_ihdr(b, dims(0, 72), true), Expect::Error);
    push(v, "header", "ihdr-bit-depth-3", "IHDR bit depth 3, CRC fixed", png_ihdr(b, byte(8, 3), true), Expect::Error);
    push(
        v,
        "header",
        "ihdr-color-type-7",
        "IHDR color type 7, CRC fixed",
        png_ihdr(b, byte(9, 7), true),
        Expect::Error,
    );
    push(
        v,
        "header",
        "ihdr-interlace-2",
        "IHDR interlace method 2, CRC fixed",
        png_ihdr(b, byte(12, 2), true),
        Expect::Error,
    );
    push(
        v,
        "header",
        "ihdr-bad-crc",
        "IHDR says 100000x100000 and its CRC is stale",
        png_ihdr(b, dims(100_000, 100_000), false),
        Expect::Error,
    );
    push(v, "header", "ihdr-length-ffffffff", "IHDR chunk length 0xFFFFFFFF", patched(b, 8, &[0xFF; 4]), Expect::Error);
    if let Some(idat) = find(b, b"IDAT", 8) {
        push(
            v,
            "header",
            "idat-length-huge",
            "IDAT chunk length 0x7FFFFFFF (past the end)",
            patched(b, idat - 4, &[0x7F, 0xFF, 0xFF, 0xFF]),
            Expect::Error,
        );
    }
}

/// Writes the deflate stream of `n` zero bytes with fixed Huffman codes: one literal, then back-references
/// of 258 bytes at distance 1 (13 bits each: a 1/159 ratio), then literals.
fn deflate_zeros(n: usize) -> Vec<u8> {
    struct Bits {
        out: Vec<u8>,
        acc: u32,
        len: u32,
    }
    impl Bits {
        /// `len` bits of `value`, least significant first (header fields, extra bits).
        fn put(&mut self, value: u32, len: u32) {
            for i in 0..len {
                self.acc |= ((value >> i) & 1) << self.len;
                self.len += 1;
                if self.len == 8 {
                    self.out.push(self.acc as u8);
                    self.acc = 0;
                    self.len = 0;
                }
            }
        }
        /// A Huffman code of `len` bits, most significant first.
        fn code(&mut self, code: u32, len: u32) {
            for i in (0..len).rev() {
                self.put((code >> i) & 1, 1);
            }
        }
    }
    let mut bits = Bits { out: Vec::with_capacity(n / 150 + 16), acc: 0, len: 0 };
    bits.put(1, 1); // final block
    bits.put(1, 2); // fixed Huffman codes
    let mut left = n;
    if left > 0 {
        bits.code(0x30, 8); // literal 0
        left -= 1;
    }
    while left >= 258 {
        bits.code(0xC5, 8); // length 258 (symbol 285)
        bits.code(0, 5); // distance 1
        left -= 258;
    }
    for _ in 0..left {
        bits.code(0x30, 8);
    }
    bits.code(0, 7); // end of block
    if bits.len > 0 {
        bits.out.push(bits.acc as u8);
    }
    bits.out
}

/// A gray 8-bit PNG of `width` x `height` whose IDAT holds the zlib stream of the first `rows` rows of zeros
/// (complete, with its Adler-32, when `rows == height`).
fn png_zero_image(width: u32, height: u32, rows: u32) -> Vec<u8> {
    let raw = (width as usize + 1) * rows as usize; // a filter byte (0) per row, then zero pixels
    let mut zlib = vec![0x78, 0x01];
    zlib.extend_from_slice(&deflate_zeros(raw));
    // Adler-32 of n zero bytes: a stays 1, b adds a (1) per byte.
    let adler = (((raw % 65_521) as u32) << 16) | 1;
    zlib.extend_from_slice(&adler.to_be_bytes());
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 0, 0, 0, 0]); // 8-bit gray, deflate, no filter method, no interlace
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    png_chunk(&mut out, b"IHDR", &ihdr);
    png_chunk(&mut out, b"IDAT", &zlib);
    png_chunk(&mut out, b"IEND", &[]);
    out
}

fn gif(b: &[u8], v: &mut Vec<Variant>) {
    let screen = |w: u16, h: u16| {
        let mut d = w.to_le_bytes().to_vec();
        d.extend_from_slice(&h.to_le_bytes());
        patched(b, 6, &d)
    };
    push(v, "bomb", "screen-65535x65535", "logical screen 65535x65535 (4.3 Gpx)", screen(65535, 65535), Expect::Error);
    push(v, "header", "screen-0x0", "logical screen 0x0", screen(0, 0), Expect::Any);
    // The image descriptor of the first frame: ',' left top width height (LE), at (0, 0), 96x72.
    if let Some(desc) = find(b, &[0x2C, 0, 0, 0, 0, 96, 0, 72, 0], 13) {
        push(
            v,
            "bomb",
            "frame-65535x65535",
            "first frame 65535x65535 inside a 96x72 screen",
            patched(b, desc + 5, &[0xFF; 4]),
            Expect::Any,
        );
        push(
            v,
            "header",
            "frame-offset-65000",
            "first frame placed at (65000, 65000)",
            patched(b, desc + 1, &[0xE8, 0xFD, 0xE8, 0xFD]),
            Expect::Any,
        );
        // After the descriptor's packed byte (and a local color table, if any) comes the LZW minimum code size.
        let packed = b.get(desc + 9).copied().unwrap_or(0);
        let lct = if packed & 0x80 != 0 { 3usize << ((packed & 7) + 1) } else { 0 };
        let lzw = desc + 10 + lct;
        push(
            v,
            "header",
            "lzw-code-size-12",
            "LZW minimum code size 12 (at most 11 is valid)",
            patched(b, lzw, &[12]),
            Expect::Error,
        );
        push(v, "header", "lzw-code-size-0", "LZW minimum code size 0", patched(b, lzw, &[0]), Expect::Any);
    }
}

fn bmp(b: &[u8], v: &mut Vec<Variant>) {
    if b.get(0..2) != Some(b"BM") {
        return;
    }
    let i32s = |at: usize, x: i32| patched(b, at, &x.to_le_bytes());
    let dims = |w: i32, h: i32| {
        let mut d = w.to_le_bytes().to_vec();
        d.extend_from_slice(&h.to_le_bytes());
        patched(b, 18, &d)
    };
    push(
        v,
        "bomb",
        "100000x100000",
        "BITMAPINFOHEADER says 100000x100000 (10 Gpx)",
        dims(100_000, 100_000),
        Expect::Error,
    );
    push(
        v,
        "header",
        "height-i32-min",
        "height i32::MIN (its absolute value overflows)",
        i32s(22, i32::MIN),
        Expect::Error,
    );
    push(v, "header", "width-negative", "width -96", i32s(18, -96), Expect::Error);
    push(v, "header", "width-0", "width 0", i32s(18, 0), Expect::Error);
    push(v, "header", "bpp-0", "0 bits per pixel", patched(b, 28, &0u16.to_le_bytes()), Expect::Error);
    push(v, "header", "bpp-7", "7 bits per pixel", patched(b, 28, &7u16.to_le_bytes()), Expect::Error);
    push(v, "header", "compression-99", "compression method 99", i32s(30, 99), Expect::Error);
    push(
        v,
        "header",
        "data-offset-past-end",
        "pixel data offset 0xFFFFFFF0",
        patched(b, 10, &0xFFFF_FFF0u32.to_le_bytes()),
        Expect::Error,
    );
    push(v, "header", "header-size-0", "info header size 0", i32s(14, 0), Expect::Error);
}

/// The offset of the first IFD.
fn tiff_ifd(b: &[u8]) -> Option<usize> {
    match b.get(0..2)? {
        b"II" => u32_at_le(b, 4).map(|x| x as usize),
        b"MM" => u32_at_be(b, 4).map(|x| x as usize),
        _ => None,
    }
}

/// The position of the value field of the first-IFD entry with `tag` (TIFF little- or big-endian).
fn tiff_entry(b: &[u8], tag: u16) -> Option<(usize, bool)> {
    let le = match b.get(0..2)? {
        b"II" => true,
        b"MM" => false,
        _ => return None,
    };
    let rd16 = |at: usize| if le { u16_at_le(b, at) } else { u16_at_be(b, at) };
    let ifd = tiff_ifd(b)?;
    let count = rd16(ifd)? as usize;
    (0..count).map(|i| ifd + 2 + 12 * i).find(|&e| rd16(e) == Some(tag)).map(|e| (e, le))
}

/// A copy with the entry `tag` rewritten as one LONG `value`.
fn tiff_set(b: &[u8], tag: u16, value: u32) -> Option<Vec<u8>> {
    let (entry, le) = tiff_entry(b, tag)?;
    let mut field = Vec::with_capacity(10);
    let (ty, count, val) = if le {
        (4u16.to_le_bytes(), 1u32.to_le_bytes(), value.to_le_bytes())
    } else {
        (4u16.to_be_bytes(), 1u32.to_be_bytes(), value.to_be_bytes())
    };
    field.extend_from_slice(&ty);
    field.extend_from_slice(&count);
    field.extend_from_slice(&val);
    patched(b, entry + 2, &field)
}

fn tiff(b: &[u8], v: &mut Vec<Variant>) {
    let both = tiff_set(b, 256, 1_000_000).and_then(|x| tiff_set(&x, 257, 1_000_000));
    push(v, "bomb", "1000000x1000000", "ImageWidth and ImageLength 1000000 (1 Tpx)", both, Expect::Error);
    push(v, "header", "width-0", "ImageWidth 0", tiff_set(b, 256, 0), Expect::Error);
    push(v, "header", "bits-per-sample-0", "BitsPerSample 0", tiff_set(b, 258, 0), Expect::Error);
    push(v, "header", "compression-999", "Compression 999 (unknown)", tiff_set(b, 259, 999), Expect::Error);
    push(
        v,
        "header",
        "strip-offsets-past-end",
        "StripOffsets 0xFFFFFF00",
        tiff_set(b, 273, 0xFFFF_FF00),
        Expect::Error,
    );
    push(
        v,
        "header",
        "strip-byte-counts-huge",
        "StripByteCounts 0x7FFFFFFF",
        tiff_set(b, 279, 0x7FFF_FFFF),
        Expect::Error,
    );
    push(v, "header", "rows-per-strip-0", "RowsPerStrip 0", tiff_set(b, 278, 0), Expect::Any);
    push(
        v,
        "header",
        "ifd-offset-past-end",
        "first IFD at 0xFFFFFFF0",
        patched(b, 4, &[0xF0, 0xFF, 0xFF, 0xFF]),
        Expect::Error,
    );
    if let Some(ifd) = tiff_ifd(b) {
        push(v, "header", "ifd-count-65535", "IFD says 65535 entries", patched(b, ifd, &[0xFF, 0xFF]), Expect::Error);
    }
}

fn webp(b: &[u8], v: &mut Vec<Variant>) {
    if b.get(0..4) != Some(b"RIFF") || b.get(8..12) != Some(b"WEBP") {
        return;
    }
    push(
        v,
        "header",
        "riff-size-4",
        "RIFF size 4 (shorter than the WEBP tag)",
        patched(b, 4, &4u32.to_le_bytes()),
        Expect::Any,
    );
    push(
        v,
        "header",
        "chunk-size-huge",
        "first chunk size 0xFFFFFFF0 (past the end)",
        patched(b, 16, &0xFFFF_FFF0u32.to_le_bytes()),
        Expect::Any,
    );
    match b.get(12..16) {
        Some(b"VP8L") => {
            // Signature 0x2F, then 14 bits width-1, 14 bits height-1, 1 bit alpha, 3 bits version (LE bits).
            let Some(word) = u32_at_le(b, 21) else { return };
            let alpha_version = word & 0xF000_0000;
            let huge = alpha_version | 0x3FFF | (0x3FFF << 14);
            push(
                v,
                "bomb",
                "vp8l-16384x16384",
                "VP8L header says 16384x16384 (268 Mpx)",
                patched(b, 21, &huge.to_le_bytes()),
                Expect::Error,
            );
            push(
                v,
                "header",
                "vp8l-version-7",
                "VP8L version 7",
                patched(b, 21, &(word | 0xE000_0000).to_le_bytes()),
                Expect::Error,
            );
            push(v, "header", "vp8l-signature", "VP8L signature byte 0x00", patched(b, 20, &[0]), Expect::Error);
        }
        Some(b"VP8X") => {
            // Canvas width-1 and height-1, 24 bits each, at 24 and 27.
            push(
                v,
                "bomb",
                "vp8x-16777216x16777216",
                "VP8X canvas 16777216x16777216",
                patched(b, 24, &[0xFF; 6]),
                Expect::Error,
            );
        }
        Some(b"VP8 ") => {
            // Key frame: 3-byte tag, start code 9D 01 2A, 14-bit width and height with 2-bit scale.
            push(
                v,
                "header",
                "vp8-16383x16383",
                "VP8 frame 16383x16383",
                patched(b, 26, &[0xFF, 0x3F, 0xFF, 0x3F]),
                Expect::Any,
            );
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------------------
// audio

fn wav(b: &[u8], v: &mut Vec<Variant>) {
    // The seed's header layout: fmt fields at 20.., "data" size at 40.
    let u16s = |at: usize, x: u16| patched(b, at, &x.to_le_bytes());
    let u32s = |at: usize, x: u32| patched(b, at, &x.to_le_bytes());
    push(v, "header", "rate-0", "sample rate 0 Hz", u32s(24, 0), Expect::Error);
    push(v, "header", "rate-4294967295", "sample rate 4294967295 Hz", u32s(24, u32::MAX), Expect::Error);
    push(v, "header", "channels-0", "0 channels", u16s(22, 0), Expect::Error);
    push(v, "header", "channels-65535", "65535 channels", u16s(22, u16::MAX), Expect::Error);
    push(v, "header", "bits-0", "0 bits per sample", u16s(34, 0), Expect::Error);
    push(v, "header", "bits-7", "7 bits per sample", u16s(34, 7), Expect::Any);
    push(v, "header", "block-align-0", "block align 0", u16s(32, 0), Expect::Any);
    push(v, "header", "format-0x1234", "format tag 0x1234 (unknown codec)", u16s(20, 0x1234), Expect::Error);
    push(
        v,
        "header",
        "data-size-4gib",
        "data chunk claims 0xFFFFFFFF bytes (4 GiB; 64 KB present)",
        u32s(40, u32::MAX),
        Expect::Any,
    );
    push(v, "header", "fmt-size-huge", "fmt chunk size 0x7FFFFFFF", u32s(16, 0x7FFF_FFFF), Expect::Error);
    push(v, "header", "riff-size-0", "RIFF size 0", u32s(4, 0), Expect::Any);
}

fn flac(b: &[u8], v: &mut Vec<Variant>) {
    if b.get(0..4) != Some(b"fLaC") {
        return;
    }
    // STREAMINFO data starts at 8: min/max block (2+2), min/max frame (3+3), then at 18: 20 bits rate,
    // 3 bits channels-1, 5 bits bits-1, 36 bits total samples.
    let Some(&b20) = b.get(20) else { return };
    push(v, "header", "rate-0", "STREAMINFO sample rate 0", patched(b, 18, &[0, 0, b20 & 0x0F]), Expect::Any);
    push(
        v,
        "header",
        "rate-1048575",
        "STREAMINFO sample rate 1048575 Hz",
        patched(b, 18, &[0xFF, 0xFF, b20 | 0xF0]),
        Expect::Any,
    );
    let Some(&b21) = b.get(21) else { return };
    push(
        v,
        "header",
        "total-samples-max",
        "STREAMINFO total samples 2^36-1 (2.3 days at 16 kHz)",
        patched(b, 21, &[b21 | 0x0F, 0xFF, 0xFF, 0xFF, 0xFF]),
        Expect::Any,
    );
    push(v, "header", "block-size-0", "STREAMINFO min and max block size 0", patched(b, 8, &[0, 0, 0, 0]), Expect::Any);
    push(
        v,
        "header",
        "metadata-length-huge",
        "STREAMINFO block length 0xFFFFFF",
        patched(b, 5, &[0xFF, 0xFF, 0xFF]),
        Expect::Error,
    );
}

fn mp3(b: &[u8], v: &mut Vec<Variant>) {
    let mut frame_from = 0;
    if b.get(0..3) == Some(b"ID3") {
        push(v, "header", "id3-size-256mib", "ID3v2 tag claims 256 MiB", patched(b, 6, &[0x7F; 4]), Expect::Any);
        let size = b.get(6..10).map_or(0, |s| s.iter().fold(0usize, |acc, &x| (acc << 7) | usize::from(x & 0x7F)));
        frame_from = 10 + size;
    }
    let Some(sync) = (frame_from..b.len().saturating_sub(1))
        .find(|&i| b.get(i) == Some(&0xFF) && b.get(i + 1).is_some_and(|x| x & 0xE0 == 0xE0))
    else {
        return;
    };
    let Some(&h2) = b.get(sync + 2) else { return };
    push(
        v,
        "header",
        "bitrate-index-15",
        "first frame bitrate index 15 (forbidden)",
        patched(b, sync + 2, &[h2 | 0xF0]),
        Expect::Any,
    );
    push(
        v,
        "header",
        "rate-index-3",
        "first frame sample-rate index 3 (reserved)",
        patched(b, sync + 2, &[h2 | 0x0C]),
        Expect::Any,
    );
}

fn ogg(b: &[u8], v: &mut Vec<Variant>) {
    // Vorbis identification header: 0x01 "vorbis", version (4), channels (1), rate (4). The page CRC is
    // left stale, as a bit flip on disk would leave it.
    let Some(id) = find(b, b"\x01vorbis", 0) else { return };
    push(v, "header", "vorbis-channels-0", "Vorbis header: 0 channels", patched(b, id + 11, &[0]), Expect::Any);
    push(v, "header", "vorbis-channels-255", "Vorbis header: 255 channels", patched(b, id + 11, &[255]), Expect::Any);
    push(
        v,
        "header",
        "vorbis-rate-0",
        "Vorbis header: sample rate 0",
        patched(b, id + 12, &0u32.to_le_bytes()),
        Expect::Any,
    );
    push(
        v,
        "header",
        "vorbis-rate-max",
        "Vorbis header: sample rate 4294967295",
        patched(b, id + 12, &u32::MAX.to_le_bytes()),
        Expect::Any,
    );
    push(v, "header", "page-segments-255", "first Ogg page says 255 segments", patched(b, 26, &[255]), Expect::Any);
}

fn adts(b: &[u8], v: &mut Vec<Variant>) {
    if b.first() != Some(&0xFF) {
        return;
    }
    let Some(&h2) = b.get(2) else { return };
    push(
        v,
        "header",
        "rate-index-15",
        "ADTS sampling-frequency index 15 (escape, invalid in ADTS)",
        patched(b, 2, &[(h2 & 0xC3) | (15 << 2)]),
        Expect::Any,
    );
    push(
        v,
        "header",
        "rate-index-13",
        "ADTS sampling-frequency index 13 (reserved)",
        patched(b, 2, &[(h2 & 0xC3) | (13 << 2)]),
        Expect::Any,
    );
    // Frame length: 13 bits from the low 2 bits of byte 3 to the top 3 bits of byte 5. 0 makes no progress.
    let (Some(&h3), Some(&h5)) = (b.get(3), b.get(5)) else { return };
    push(
        v,
        "header",
        "frame-length-0",
        "first ADTS frame length 0",
        patched(b, 3, &[h3 & 0xFC, 0, h5 & 0x1F]),
        Expect::Any,
    );
    push(
        v,
        "header",
        "channel-config-0",
        "ADTS channel configuration 0",
        patched(b, 2, &[h2 & 0xFE, h3 & 0x3F]),
        Expect::Any,
    );
}

/// The position just after the 4-byte type of the first box of type `kind`.
fn mp4_box(b: &[u8], kind: &[u8; 4]) -> Option<usize> {
    find(b, kind, 4).map(|p| p + 4)
}

fn isobmff(b: &[u8], v: &mut Vec<Variant>) {
    let max = 0x7FFF_FFFFu32.to_be_bytes();
    if let Some(p) = mp4_box(b, b"stsz") {
        push(
            v,
            "header",
            "stsz-count-huge",
            "stsz: 2^31-1 samples (a 8 GiB table)",
            patched(b, p + 8, &max),
            Expect::Any,
        );
    }
    if let Some(p) = mp4_box(b, b"stco") {
        push(v, "header", "stco-count-huge", "stco: 2^31-1 chunk offsets", patched(b, p + 4, &max), Expect::Any);
    }
    if let Some(p) = mp4_box(b, b"stts") {
        push(v, "header", "stts-count-huge", "stts: 2^31-1 entries", patched(b, p + 4, &max), Expect::Any);
    }
    if let Some(p) = mp4_box(b, b"stsc") {
        push(v, "header", "stsc-count-huge", "stsc: 2^31-1 entries", patched(b, p + 4, &max), Expect::Any);
    }
    if let Some(p) = mp4_box(b, b"mdhd") {
        // Version 0: version/flags (4), creation (4), modification (4), timescale (4), duration (4).
        push(v, "header", "mdhd-timescale-0", "mdhd: timescale 0", patched(b, p + 12, &[0; 4]), Expect::Any);
        push(
            v,
            "header",
            "mdhd-duration-max",
            "mdhd: duration 0xFFFFFFFF",
            patched(b, p + 16, &[0xFF; 4]),
            Expect::Any,
        );
    }
    if let Some(p) = mp4_box(b, b"mp4a") {
        // Audio sample entry: reserved (6), data ref (2), version (2), revision (2), vendor (4),
        // channels (2) at 16, sample size (2), compression id (2), packet size (2), rate 16.16 at 24.
        push(v, "header", "mp4a-channels-0", "mp4a: 0 channels", patched(b, p + 16, &[0, 0]), Expect::Any);
        push(v, "header", "mp4a-rate-0", "mp4a: sample rate 0", patched(b, p + 24, &[0; 4]), Expect::Any);
    }
    if let Some(p) = mp4_box(b, b"avc1") {
        // Visual sample entry: width and height at 24 and 26.
        push(v, "bomb", "avc1-65535x65535", "avc1: 65535x65535 frames", patched(b, p + 24, &[0xFF; 4]), Expect::Any);
    }
    if let Some(p) = mp4_box(b, b"moov") {
        push(
            v,
            "header",
            "moov-size-huge",
            "moov box size 0xFFFFFFF0 (past the end)",
            patched(b, p - 8, &[0xFF, 0xFF, 0xFF, 0xF0]),
            Expect::Any,
        );
        push(
            v,
            "header",
            "moov-size-0",
            "moov box size 0 (to the end of file)",
            patched(b, p - 8, &[0; 4]),
            Expect::Any,
        );
        push(
            v,
            "header",
            "moov-size-1-largesize",
            "moov box size 1 (a 64-bit size follows: here the next box's bytes)",
            patched(b, p - 8, &[0, 0, 0, 1]),
            Expect::Any,
        );
    }
    push(
        v,
        "header",
        "ftyp-size-7",
        "first box size 7 (smaller than a box header)",
        patched(b, 0, &[0, 0, 0, 7]),
        Expect::Any,
    );
}

fn matroska(b: &[u8], v: &mut Vec<Variant>) {
    if b.get(0..4) != Some(&[0x1A, 0x45, 0xDF, 0xA3]) {
        return;
    }
    push(
        v,
        "header",
        "ebml-size-unknown",
        "EBML header size byte 0xFF (unknown size)",
        patched(b, 4, &[0xFF]),
        Expect::Any,
    );
    if let Some(seg) = find(b, &[0x18, 0x53, 0x80, 0x67], 4) {
        push(
            v,
            "header",
            "segment-size-2^56",
            "Segment size 2^56-2 (petabytes)",
            patched(b, seg + 4, &[0x01, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFE]),
            Expect::Any,
        );
    }
    // SamplingFrequency (0xB5) as an 8-byte float.
    if let Some(p) = find(b, &[0xB5, 0x88], 4) {
        push(
            v,
            "header",
            "sampling-frequency-0",
            "Audio SamplingFrequency 0.0",
            patched(b, p + 2, &0f64.to_be_bytes()),
            Expect::Any,
        );
        push(
            v,
            "header",
            "sampling-frequency-1e300",
            "Audio SamplingFrequency 1e300",
            patched(b, p + 2, &1e300f64.to_be_bytes()),
            Expect::Any,
        );
        push(
            v,
            "header",
            "sampling-frequency-nan",
            "Audio SamplingFrequency NaN",
            patched(b, p + 2, &f64::NAN.to_be_bytes()),
            Expect::Any,
        );
    }
    // Channels (0x9F) as a 1-byte integer.
    if let Some(p) = find(b, &[0x9F, 0x81], 4) {
        push(v, "header", "channels-0", "Audio Channels 0", patched(b, p + 2, &[0]), Expect::Any);
        push(v, "header", "channels-255", "Audio Channels 255", patched(b, p + 2, &[255]), Expect::Any);
    }
    // PixelWidth (0xB0) as a 1- or 2-byte integer.
    if let Some(p) = find(b, &[0xB0, 0x81], 4) {
        push(v, "header", "pixel-width-0", "Video PixelWidth 0", patched(b, p + 2, &[0]), Expect::Any);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_the_png_reference() {
        // The CRC of an IEND chunk is fixed by the format.
        assert_eq!(crc32(b"IEND"), 0xAE42_6082);
    }

    #[test]
    fn deflated_zeros_inflate_to_zeros() {
        // Decoded by the PNG decoder of spdl-io itself: a valid image of zeros.
        let png = png_zero_image(300, 200, 200);
        let info = crate::image::image_info(&png, "zeros.png").expect("header");
        assert_eq!((info.width, info.height), (300, 200));
        let buf = crate::image::decode_image(
            &png,
            "zeros.png",
            &crate::image::ImageOptions::default(),
            &crate::image::Transform::None,
            &spdl_buffer::system_allocator(),
        )
        .expect("decodes");
        assert_eq!(buf.shape(), &[200, 300, 3]);
        assert!(buf.as_bytes().iter().all(|&x| x == 0));
    }
}
