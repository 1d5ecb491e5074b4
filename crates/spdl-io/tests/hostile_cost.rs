//! Inputs and arguments whose cost comes from a header or a number rather than from the data: each is
//! refused from what it claims, before anything of that size is allocated, with an error naming the item,
//! and the limit itself is exact (at the limit passes, one above fails).
#![cfg(all(feature = "image", feature = "audio"))]

use spdl_buffer::{SharedAllocator, system_allocator};
use spdl_io::audio::{AudioBatchOptions, AudioOptions, decode_audio, decode_audio_batch, encode_wav_i16};
use spdl_io::image::{BatchDecoder, BatchOptions, ImageOptions, Transform, decode_image, load_image};
use spdl_io::{Error, MediaInput, ReadLimits, probe, read_file};

fn alloc() -> SharedAllocator {
    system_allocator()
}

/// A gray PNG of `w` x `h` zeros (deflates to almost nothing: an aspect-ratio bomb costs a few KB).
fn gray_png(w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Grayscale);
        enc.set_compression(png::Compression::Fast);
        let mut writer = enc.write_header().unwrap_or_else(|e| panic!("{e}"));
        let data = vec![0u8; (w as usize) * (h as usize)];
        writer.write_image_data(&data).unwrap_or_else(|e| panic!("{e}"));
    }
    out
}

fn limit_of(e: &Error) -> Option<(&str, u64, u64)> {
    match e {
        Error::LimitExceeded { what, value, limit, .. } => Some((what.as_str(), *value, *limit)),
        Error::BatchItem { source, .. } => limit_of(source),
        _ => None,
    }
}

#[test]
fn aspect_ratio_bomb_is_refused_before_the_resize() {
    // 10,000,000 x 1: within the pixel limit, but resizing it to 224 x 224 would hold 10 M x 224 pixels
    // between the resampler's passes (6.7 GB).
    let png = gray_png(10_000_000, 1);
    assert!(png.len() < 100_000, "{}", png.len());
    let err = decode_image(&png, "wide.png", &ImageOptions::default(), &Transform::resize(224, 224), &alloc())
        .err()
        .unwrap_or_else(|| panic!("the bomb decoded"));
    let (what, value, _) = limit_of(&err).unwrap_or_else(|| panic!("{err}"));
    assert_eq!((what, value), ("resize intermediate pixels", 2_240_000_000));
    assert!(err.to_string().contains("wide.png"), "{err}");

    // In a non-strict batch it is one failed item; its neighbour decodes.
    let dec = BatchDecoder::new(BatchOptions { strict: false, threads: Some(2), ..BatchOptions::default() }, alloc())
        .unwrap_or_else(|e| panic!("{e}"));
    let good = gray_png(300, 200);
    let out =
        dec.decode(&[("wide.png", png.as_slice()), ("ok.png", good.as_slice())]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.failures.len(), 1);
    assert_eq!((out.failures[0].batch_item().map(|(i, _)| i), out.failures[0].item()), (Some(0), Some("wide.png")));
}

#[test]
fn resize_intermediate_limit_is_exact() {
    let opts = ImageOptions { max_pixels: 10_000, ..ImageOptions::default() };
    // 1000 x 1 to 10 x 10: the intermediate is 1000 x 10 = 10,000 pixels: at the limit.
    let at = gray_png(1000, 1);
    let buf = decode_image(&at, "at.png", &opts, &Transform::resize(10, 10), &alloc());
    assert_eq!(buf.map(|b| b.shape().to_vec()).ok(), Some(vec![10, 10, 3]));
    let above = gray_png(1001, 1);
    let err = decode_image(&above, "above.png", &opts, &Transform::resize(10, 10), &alloc()).err();
    let err = err.unwrap_or_else(|| panic!("decoded above the limit"));
    assert_eq!(limit_of(&err), Some(("resize intermediate pixels", 10_010, 10_000)));
}

#[test]
fn requested_output_size_is_bounded() {
    let png = gray_png(64, 48);
    // 65535 x 65535 is 4.3 G pixels (12.9 GB of RGB): refused as an argument, before decoding.
    let err = decode_image(&png, "small.png", &ImageOptions::default(), &Transform::resize(65535, 65535), &alloc());
    assert!(matches!(err, Err(Error::InvalidOptions(ref m)) if m.contains("65535x65535")), "{err:?}");
    assert!(
        BatchDecoder::new(BatchOptions { transform: Transform::resize(65535, 65535), ..Default::default() }, alloc())
            .is_err()
    );
    // At the limit it is allowed.
    let opts = ImageOptions { max_pixels: 100 * 100, ..ImageOptions::default() };
    assert!(decode_image(&png, "small.png", &opts, &Transform::resize(100, 100), &alloc()).is_ok());
    assert!(decode_image(&png, "small.png", &opts, &Transform::resize(101, 100), &alloc()).is_err());
}

#[test]
fn batch_buffer_larger_than_the_budget_is_refused() {
    // 2^20 slots of 224 x 224 x 3 f32 is 630 GB: refused before the buffer is allocated.
    let dec = BatchDecoder::new(
        BatchOptions { normalize: Some(spdl_io::image::Normalize::imagenet()), ..BatchOptions::default() },
        alloc(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let items: Vec<(String, Vec<u8>)> = (0..1 << 20).map(|i| (format!("{i}.png"), Vec::new())).collect();
    let err = dec.decode(&items).err().unwrap_or_else(|| panic!("allocated the batch"));
    assert_eq!(limit_of(&err).map(|l| l.0), Some("batch buffer bytes"), "{err}");
}

fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap_or_default();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn special_files_are_refused_at_every_path_entry_point() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let fifo = dir.path().join("pipe.jpg");
    mkfifo(&fifo);
    let zero = dir.path().join("zero.wav");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap_or_else(|e| panic!("{e}"));
    let t = Transform::resize(8, 8);
    for path in [&fifo, &zero] {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let errs = [
            load_image(path, &ImageOptions::default(), &t, &alloc()).err(),
            BatchDecoder::new(BatchOptions { strict: true, ..Default::default() }, alloc())
                .and_then(|d| d.load(&[path]))
                .err(),
            decode_audio(path.as_path(), &AudioOptions::default(), &alloc()).err(),
            probe(MediaInput::from(path)).err(),
        ];
        for e in errs {
            let msg = e.map(|e| spdl_report::error_chain(&e)).unwrap_or_else(|| panic!("{name} was accepted"));
            assert!(msg.contains(name) && msg.contains("not a regular file"), "{msg}");
            assert!(!msg.contains("empty input"), "{msg}");
        }
    }
    // Opted in with a byte limit, /dev/zero is read up to it and refused.
    let opt_in = ReadLimits { max_bytes: 1 << 20, allow_special_files: true };
    let err = read_file(&zero, &opt_in).err().map(|e| spdl_report::error_chain(&e)).unwrap_or_default();
    assert!(err.contains("file bytes"), "{err}");
}

#[test]
fn resample_bomb_is_refused_from_the_header() {
    // 16 frames declared at 1 Hz, resampled to 44.1 kHz: rubato's FFT would be 45 M points per chunk.
    let wav = encode_wav_i16(&[0i16; 16], 1, 1);
    assert!(wav.len() < 100);
    let opts = AudioOptions { sample_rate: Some(44_100), ..AudioOptions::default() };
    let err = decode_audio(MediaInput::bytes(&wav, "one-hz.wav"), &opts, &alloc()).err();
    let err = err.unwrap_or_else(|| panic!("resampled the bomb"));
    assert!(limit_of(&err).is_some_and(|l| l.0.starts_with("resampler bytes")), "{err}");
    assert!(err.to_string().contains("one-hz.wav"), "{err}");
    // Ordinary conversions stay far inside the limit.
    for (from, to) in [(8_000, 768_000), (44_100, 48_000), (48_000, 16_000), (44_099, 44_100)] {
        let wav = encode_wav_i16(&vec![0i16; 2000], 1, from);
        let opts = AudioOptions { sample_rate: Some(to), ..AudioOptions::default() };
        let r = decode_audio(MediaInput::bytes(&wav, "ok.wav"), &opts, &alloc());
        assert!(r.is_ok(), "{from} -> {to}: {:?}", r.err());
    }
}

#[test]
fn audio_batch_length_is_bounded_before_the_buffer() {
    let wav = encode_wav_i16(&[0i16; 800], 2, 8000);
    let inputs = [MediaInput::bytes(&wav, "a.wav"), MediaInput::bytes(&wav, "b.wav")];
    let opts = AudioBatchOptions { num_frames: 1_000_000_000, strict: false, ..AudioBatchOptions::default() };
    let err = decode_audio_batch(&inputs, &opts, &alloc()).err();
    assert!(matches!(err, Some(Error::InvalidOptions(ref m)) if m.contains("max_samples")), "{err:?}");
}

/// CRC-32 (ISO-HDLC, as PNG), bit by bit: test data is small.
fn crc32(parts: &[&[u8]]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in parts.iter().flat_map(|p| p.iter()) {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
        }
    }
    !c
}

/// A zlib stream of `1 + 258 * runs` zero bytes: one fixed-Huffman block of a literal zero and `runs`
/// matches of length 258 at distance 1 (13 bits each: 2.5 MB of output per 16 KB).
fn zlib_zeros(runs: usize) -> (Vec<u8>, usize) {
    struct Bits {
        out: Vec<u8>,
        acc: u64,
        n: u32,
    }
    impl Bits {
        fn put(&mut self, v: u32, n: u32) {
            self.acc |= u64::from(v) << self.n;
            self.n += n;
            while self.n >= 8 {
                self.out.push(self.acc as u8);
                self.acc >>= 8;
                self.n -= 8;
            }
        }
        /// Huffman codes go most significant bit first.
        fn code(&mut self, code: u32, len: u32) {
            self.put(code.reverse_bits() >> (32 - len), len);
        }
    }
    let mut b = Bits { out: vec![0x78, 0x01], acc: 0, n: 0 };
    b.put(1, 1); // BFINAL
    b.put(1, 2); // fixed Huffman
    b.code(0x30, 8); // literal 0
    for _ in 0..runs {
        b.code(0xC5, 8); // length 258 (symbol 285)
        b.code(0, 5); // distance 1
    }
    b.code(0, 7); // end of block
    let pad = (8 - b.n % 8) % 8;
    b.put(0, pad);
    let len = 1 + 258 * runs;
    let adler = ((len % 65521) as u32) << 16 | 1;
    let mut out = b.out;
    out.extend_from_slice(&adler.to_be_bytes());
    (out, len)
}

/// A gray 16 x 16 PNG with an iCCP chunk (written before the pixels, as the format wants) whose profile
/// inflates to `1 + 258 * runs` bytes.
fn png_with_iccp(runs: usize) -> (Vec<u8>, usize) {
    let png = gray_png(16, 16);
    let (z, inflated) = zlib_zeros(runs);
    let mut body = b"bomb\0\0".to_vec();
    body.extend_from_slice(&z);
    // Signature (8) + IHDR (25): the chunk goes right after the header.
    let mut out = png[..33].to_vec();
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(b"iCCP");
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32(&[b"iCCP", &body]).to_be_bytes());
    out.extend_from_slice(&png[33..]);
    (out, inflated)
}

#[test]
fn png_metadata_counts_against_the_decoders_allowance() {
    // 1.6 MB of file, 258 MB of ICC profile, 16 x 16 pixels: the PNG decoder inflates the profile up to the
    // allowance (16 MiB + 16 bytes a pixel), then drops it and decodes the pixels: a bounded-cost success.
    // (That the allowance refuses the profile is asserted in the unit test
    // `image::decode::tests::png_metadata_is_held_to_the_allowance`.)
    let (bomb, inflated) = png_with_iccp(1_000_000);
    assert!(bomb.len() < 2 << 20 && inflated > 250_000_000, "{} {inflated}", bomb.len());
    for transform in [Transform::None, Transform::resize(8, 8)] {
        let out = decode_image(&bomb, "icc-bomb.png", &ImageOptions::default(), &transform, &alloc());
        let shape = out.unwrap_or_else(|e| panic!("{e}")).shape().to_vec();
        assert_eq!(shape[..2], if transform == Transform::None { [16, 16] } else { [8, 8] });
    }
    let info = spdl_io::image::image_info(&bomb, "icc-bomb.png").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((info.width, info.height), (16, 16));
    let bad = ImageOptions { max_scan_pixels: 0, ..ImageOptions::default() };
    assert!(decode_image(&bomb, "x.png", &bad, &Transform::None, &alloc()).is_err());
}

/// A gray `w` x `h` progressive JPEG header followed by `scans` scans of one entropy-coded byte each: the
/// markers a decoder walks, without pixels worth decoding.
fn progressive_jpeg(w: u16, h: u16, scans: usize) -> Vec<u8> {
    let mut b = vec![0xFF, 0xD8];
    let seg = |b: &mut Vec<u8>, marker: u8, body: &[u8]| {
        b.extend_from_slice(&[0xFF, marker]);
        b.extend_from_slice(&((body.len() + 2) as u16).to_be_bytes());
        b.extend_from_slice(body);
    };
    let mut dqt = vec![0u8];
    dqt.extend_from_slice(&[1u8; 64]);
    seg(&mut b, 0xDB, &dqt);
    let [wh, wl] = w.to_be_bytes();
    let [hh, hl] = h.to_be_bytes();
    seg(&mut b, 0xC2, &[8, hh, hl, wh, wl, 1, 1, 0x11, 0]);
    // DC table 0: one code of length 1, for symbol 0.
    let mut dht = vec![0x00, 1];
    dht.extend_from_slice(&[0u8; 15]);
    dht.push(0);
    seg(&mut b, 0xC4, &dht);
    for i in 0..scans {
        // A DC scan, then AC refinement scans of one coefficient band (Ss = Se = 1 + i % 63).
        let band = if i == 0 { 0 } else { 1 + (i % 63) as u8 };
        seg(&mut b, 0xDA, &[1, 1, 0x00, band, band, 0]);
        b.extend_from_slice(&[0x00, 0xFF, 0x00]); // entropy-coded data with a stuffed 0xFF
    }
    b.extend_from_slice(&[0xFF, 0xD9]);
    b
}

#[test]
fn progressive_jpeg_work_is_bounded_from_its_markers() {
    // 8192 x 8192 x 500 scans: 33.5 G pixel-passes (26–32 s of decode before).
    let bomb = progressive_jpeg(8192, 8192, 500);
    assert!(bomb.len() < 10_000);
    let t = std::time::Instant::now();
    let err = decode_image(&bomb, "scans.jpg", &ImageOptions::default(), &Transform::None, &alloc())
        .err()
        .unwrap_or_else(|| panic!("decoded"));
    assert!(t.elapsed().as_secs_f64() < 1.0, "{:?}", t.elapsed());
    let (what, value, limit) = limit_of(&err).unwrap_or_else(|| panic!("{err}"));
    assert!(what.starts_with("JPEG decode work (pixels x scans"), "{err}");
    assert_eq!(limit, spdl_io::image::DEFAULT_MAX_SCAN_PIXELS);
    // Counting stops at the first scan over the limit: 64 scans of 8192 x 8192 pass 2^32.
    assert_eq!(value, 8192 * 8192 * 65);
    assert!(err.to_string().contains("scans.jpg"), "{err}");
    // The limit is exact: 8 scans of 8192 x 8192 is 2^29, refused below that, let through above it.
    let eight = progressive_jpeg(8192, 8192, 8);
    let opts = |max_scan_pixels| ImageOptions { max_scan_pixels, max_pixels: 1 << 30, ..ImageOptions::default() };
    let tight = decode_image(&eight, "eight.jpg", &opts((1 << 29) - 1), &Transform::None, &alloc()).err();
    assert!(tight.as_ref().and_then(limit_of).is_some_and(|l| l.1 == 1 << 29), "{tight:?}");
    // At the limit it goes on to the decoder (which may refuse this synthetic stream, but not for its work).
    let at = decode_image(&eight, "eight.jpg", &opts(1 << 29), &Transform::resize(64, 64), &alloc()).err();
    assert!(at.as_ref().and_then(limit_of).is_none_or(|l| !l.0.starts_with("JPEG decode work")), "{at:?}");
}

/// A WAVE_FORMAT_EXTENSIBLE file of `channels` 16-bit PCM channels with `mask`, `frames` frames of zeros.
fn extensible_wav(channels: u16, mask: u32, frames: usize) -> Vec<u8> {
    let block = 2 * channels;
    let data_len = frames * usize::from(block);
    let mut b = b"RIFF".to_vec();
    b.extend_from_slice(&((4 + 8 + 40 + 8 + data_len) as u32).to_le_bytes());
    b.extend_from_slice(b"WAVEfmt ");
    b.extend_from_slice(&40u32.to_le_bytes());
    b.extend_from_slice(&0xFFFEu16.to_le_bytes());
    b.extend_from_slice(&channels.to_le_bytes());
    b.extend_from_slice(&8000u32.to_le_bytes());
    b.extend_from_slice(&(8000 * u32::from(block)).to_le_bytes());
    b.extend_from_slice(&block.to_le_bytes());
    b.extend_from_slice(&16u16.to_le_bytes());
    b.extend_from_slice(&22u16.to_le_bytes()); // cbSize
    b.extend_from_slice(&16u16.to_le_bytes()); // valid bits
    b.extend_from_slice(&mask.to_le_bytes());
    // KSDATAFORMAT_SUBTYPE_PCM
    b.extend_from_slice(&[
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71,
    ]);
    b.extend_from_slice(b"data");
    b.extend_from_slice(&(data_len as u32).to_le_bytes());
    b.resize(b.len() + data_len, 0);
    b
}

#[test]
fn extensible_wav_channels_are_limited_on_every_backend() {
    use spdl_io::audio::AudioBackend;
    // 1000 channels with an 8-channel mask: symphonia read it as 8 scrambled channels.
    let wav = extensible_wav(1000, 0xFF, 100);
    let backends = [AudioBackend::Auto, AudioBackend::Symphonia];
    for backend in backends {
        let opts = AudioOptions { backend, ..AudioOptions::default() };
        let err = decode_audio(MediaInput::bytes(&wav, "wide.wav"), &opts, &alloc()).err();
        let err = err.unwrap_or_else(|| panic!("{backend:?}: decoded"));
        assert_eq!(limit_of(&err), Some(("channels", 1000, 64)), "{backend:?}: {err}");
        assert!(err.to_string().contains("wide.wav"), "{err}");
    }
    // From a file too (the header is read through the path).
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("wide.wav");
    std::fs::write(&path, &wav).unwrap_or_else(|e| panic!("{e}"));
    let opts = AudioOptions { backend: AudioBackend::Symphonia, ..AudioOptions::default() };
    let err = decode_audio(MediaInput::Path(&path), &opts, &alloc()).err();
    assert!(err.as_ref().and_then(limit_of) == Some(("channels", 1000, 64)), "{err:?}");

    // A mask that names fewer channels than the header states is legal (the rest are unpositioned): every
    // stated channel comes out, on both backends.
    let four = extensible_wav(4, 0x3, 100);
    for backend in backends {
        let opts = AudioOptions { backend, ..AudioOptions::default() };
        let out = decode_audio(MediaInput::bytes(&four, "four.wav"), &opts, &alloc());
        assert_eq!(out.map(|a| a.buffer.shape().to_vec()).ok(), Some(vec![4, 100]), "{backend:?}");
    }
}
