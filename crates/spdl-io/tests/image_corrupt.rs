//! Hostile input: corrupt, truncated, empty, mislabeled and decompression-bomb files give typed errors,
//! never a panic, an abort or a huge allocation.
#![cfg(feature = "synth")]

mod image_util;

use std::alloc::{GlobalAlloc, Layout as MemLayout, System};
use std::cell::Cell;
use std::sync::mpsc;
use std::time::Duration;

use image_util::*;
use spdl_io::Error;
use spdl_io::image::{BatchOptions, ImageFormat, ImageOptions, Transform, decode_image_batch};

/// Records the largest single allocation made by each thread, to prove limits are checked before
/// anything image-sized is allocated.
struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: forwards every call to the system allocator unchanged; only records sizes in a thread-local
// `Cell` (const-initialized, no destructor, so accessing it never allocates).
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: MemLayout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: MemLayout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: MemLayout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: MemLayout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

fn largest_allocation_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let out = f();
    (out, LARGEST.with(Cell::get))
}

/// Runs `f` on its own thread and fails if it takes longer than `limit` (a hung decoder).
fn with_watchdog(limit: Duration, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(limit) {
        Ok(()) => handle.join().expect("test thread"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = handle.join() {
                std::panic::resume_unwind(p)
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("decoding took longer than {limit:?}: a decoder hangs"),
    }
}

fn is_typed(e: &Error) -> bool {
    matches!(e, Error::Empty { .. } | Error::UnknownFormat { .. } | Error::Decode { .. } | Error::LimitExceeded { .. })
}

fn corpus() -> Vec<(&'static str, Vec<u8>)> {
    let (w, h) = (120, 90);
    vec![
        ("jpeg", jpeg(30, w, h, false)),
        ("progressive jpeg", jpeg(30, w, h, true)),
        ("png", encoded(30, w, h, ImageFormat::Png)),
        ("webp", encoded(30, w, h, ImageFormat::Webp)),
        ("gif", encoded(30, w, h, ImageFormat::Gif)),
        ("bmp", encoded(30, w, h, ImageFormat::Bmp)),
        ("tiff", encoded(30, w, h, ImageFormat::Tiff)),
    ]
}

#[test]
fn zero_bytes_and_non_images() {
    let opts = ImageOptions::default();
    match spdl_io::image::decode_image(b"", "empty.jpg", &opts, &Transform::None, &alloc()) {
        Err(Error::Empty { item }) => assert_eq!(item, "empty.jpg"),
        other => panic!("{other:?}"),
    }
    for junk in [&b"<html><body>404</body></html>"[..], b"\0\0\0\0\0\0\0\0\0\0", b"\xFF\xD8", b"GIF8"] {
        match spdl_io::image::decode_image(junk, "photo.jpg", &opts, &Transform::resize(8, 8), &alloc()) {
            Err(e @ Error::UnknownFormat { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("photo.jpg") && msg.contains(".jpg"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn wrong_extension_does_not_matter() {
    for (_, bytes) in corpus() {
        let a = spdl_io::image::decode_image(&bytes, "x.png", &ImageOptions::default(), &Transform::None, &alloc())
            .unwrap();
        let b = spdl_io::image::decode_image(&bytes, "x.gif", &ImageOptions::default(), &Transform::None, &alloc())
            .unwrap();
        assert_eq!(a.as_bytes(), b.as_bytes());
    }
}

#[test]
fn truncated_files_error_or_decode_every_pixel() {
    with_watchdog(Duration::from_secs(600), || {
        for (name, bytes) in corpus() {
            let full = decode_rgb(&bytes);
            let n = bytes.len();
            let mut cuts: Vec<usize> = (0..n).step_by((n / 97).max(1)).collect();
            cuts.extend((1..=8).map(|k| n.saturating_sub(k)));
            for cut in cuts {
                match decode(&bytes[..cut], &ImageOptions::default(), &Transform::None) {
                    Ok(buf) => {
                        // Only trailing metadata may be lost: a decode that succeeds must be complete.
                        assert!(!name.contains("jpeg"), "{name} cut at {cut}/{n} decoded without error");
                        assert_eq!(buf.as_bytes(), &full[..], "{name} cut at {cut}/{n}: wrong pixels, no error");
                    }
                    Err(e) => assert!(is_typed(&e), "{name} cut at {cut}: {e:?}"),
                }
            }
        }
    });
}

#[test]
fn truncated_jpeg_decodes_when_allowed() {
    let bytes = jpeg(31, 200, 150, false);
    let cut = &bytes[..bytes.len() * 7 / 10];
    let e = decode(cut, &ImageOptions::default(), &Transform::None).unwrap_err();
    let msg = spdl_report::error_chain(&e);
    assert!(msg.contains("truncated"), "{msg}");
    let buf =
        decode(cut, &ImageOptions { allow_truncated: true, ..ImageOptions::default() }, &Transform::None).unwrap();
    assert_eq!(buf.shape(), &[150, 200, 3]);
    // The top rows are intact.
    let full = decode_rgb(&bytes);
    assert_eq!(&buf.as_bytes()[..200 * 3 * 16], &full[..200 * 3 * 16]);
}

#[test]
fn flipped_bytes_never_panic_or_hang() {
    with_watchdog(Duration::from_secs(600), || {
        // A small pixel limit: a flipped size field must not make a test allocate gigabytes.
        let opts = ImageOptions { max_pixels: 4_000_000, ..ImageOptions::default() };
        let mut state = 0x1234_5678_9ABC_DEF0u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut outcomes = [0usize; 2];
        for (name, bytes) in corpus() {
            for round in 0..150 {
                let mut bad = bytes.clone();
                for _ in 0..1 + round % 4 {
                    let at = (next() % bad.len() as u64) as usize;
                    bad[at] ^= (next() % 255 + 1) as u8;
                }
                for t in [Transform::None, Transform::resize(32, 32)] {
                    match decode(&bad, &opts, &t) {
                        Ok(_) => outcomes[0] += 1,
                        Err(e) => {
                            assert!(is_typed(&e), "{name} round {round}: {e:?}");
                            outcomes[1] += 1;
                        }
                    }
                }
            }
        }
        assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
    });
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// Rewrites the size fields of a file's header to `w` x `h` (or as large as the format allows).
fn bomb(format: ImageFormat, mut b: Vec<u8>, w: u32, h: u32) -> Vec<u8> {
    match format {
        ImageFormat::Jpeg => {
            let sof = b.windows(2).position(|m| m[0] == 0xFF && (m[1] == 0xC0 || m[1] == 0xC2)).unwrap();
            b[sof + 5..sof + 7].copy_from_slice(&(h as u16).to_be_bytes());
            b[sof + 7..sof + 9].copy_from_slice(&(w as u16).to_be_bytes());
        }
        ImageFormat::Png => {
            b[16..20].copy_from_slice(&w.to_be_bytes());
            b[20..24].copy_from_slice(&h.to_be_bytes());
            let crc = crc32(&b[12..29]);
            b[29..33].copy_from_slice(&crc.to_be_bytes());
        }
        ImageFormat::Gif => {
            b[6..8].copy_from_slice(&(w as u16).to_le_bytes());
            b[8..10].copy_from_slice(&(h as u16).to_le_bytes());
        }
        ImageFormat::Bmp => {
            b[18..22].copy_from_slice(&(w as i32).to_le_bytes());
            b[22..26].copy_from_slice(&(h as i32).to_le_bytes());
        }
        ImageFormat::Webp => {
            assert_eq!(&b[12..16], b"VP8L", "expected a simple lossless WebP");
            // 14 bits width-1, 14 bits height-1 (image-webp reads at most 16383 per side).
            let header = u32::from_le_bytes(b[21..25].try_into().unwrap());
            let side = (w.min(16383) - 1) | ((h.min(16383) - 1) << 14);
            b[21..25].copy_from_slice(&((header & !0x0FFF_FFFF) | side).to_le_bytes());
        }
        ImageFormat::Tiff => {
            assert_eq!(&b[..4], b"II*\0");
            let ifd = u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize;
            let n = u16::from_le_bytes(b[ifd..ifd + 2].try_into().unwrap()) as usize;
            for e in 0..n {
                let at = ifd + 2 + 12 * e;
                let tag = u16::from_le_bytes(b[at..at + 2].try_into().unwrap());
                // Width, height, and rows per strip (so that the single strip stays consistent).
                let value = match tag {
                    256 => w,
                    257 | 278 => h,
                    _ => continue,
                };
                b[at + 2..at + 4].copy_from_slice(&4u16.to_le_bytes()); // LONG
                b[at + 8..at + 12].copy_from_slice(&value.to_le_bytes());
            }
        }
        _ => unreachable!(),
    }
    b
}

#[test]
fn decompression_bombs_are_refused_from_the_header() {
    for format in
        [ImageFormat::Jpeg, ImageFormat::Png, ImageFormat::Gif, ImageFormat::Bmp, ImageFormat::Webp, ImageFormat::Tiff]
    {
        let small = encoded(32, 32, 16, format); // small enough for a single TIFF strip
        let huge = bomb(format, small, 60_000, 60_000);
        let info = spdl_io::image::image_info(&huge, "bomb").unwrap();
        assert!(u64::from(info.width) * u64::from(info.height) > 200_000_000, "{format}: {info:?}");
        for t in [Transform::None, Transform::resize(224, 224)] {
            let (r, largest) = largest_allocation_during(|| decode(&huge, &ImageOptions::default(), &t));
            match r {
                Err(Error::LimitExceeded { item, what, value, limit }) => {
                    assert_eq!((item.as_str(), what.as_str()), ("test-item", "pixels"));
                    assert_eq!(value, u64::from(info.width) * u64::from(info.height));
                    assert_eq!(limit, spdl_io::image::DEFAULT_MAX_PIXELS);
                }
                other => panic!("{format}: {other:?}"),
            }
            assert!(largest < 16 << 20, "{format}: allocated {largest} bytes before refusing");
        }
    }
}

#[test]
fn the_pixel_limit_is_configurable() {
    let bytes = encoded(33, 64, 48, ImageFormat::Png);
    let opts = ImageOptions { max_pixels: 1000, ..ImageOptions::default() };
    match decode(&bytes, &opts, &Transform::None) {
        Err(Error::LimitExceeded { value: 3072, limit: 1000, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(decode(&bytes, &ImageOptions { max_pixels: 0, ..ImageOptions::default() }, &Transform::None).is_err());
    assert!(decode(&bytes, &ImageOptions { max_pixels: 3072, ..ImageOptions::default() }, &Transform::None).is_ok());
}

#[test]
fn corrupt_items_in_a_batch_are_reported_by_index() {
    let good = jpeg(34, 100, 80, false);
    let mut items: Vec<(String, Vec<u8>)> = corpus().into_iter().map(|(n, b)| (n.to_string(), b)).collect();
    items.push(("zero.jpg".into(), Vec::new()));
    items.push(("cut.jpg".into(), good[..good.len() / 2].to_vec()));
    items.push(("bomb.png".into(), bomb(ImageFormat::Png, encoded(1, 8, 8, ImageFormat::Png), 100_000, 100_000)));
    items.push(("good.jpg".into(), good));
    let opts = BatchOptions {
        transform: Transform::resize(16, 16),
        strict: false,
        threads: Some(2),
        ..BatchOptions::default()
    };
    let out = decode_image_batch(&items, &opts, &alloc()).unwrap();
    let failed: Vec<(usize, &str)> =
        out.failures.iter().map(|f| (f.batch_item().map_or(usize::MAX, |(i, _)| i), f.item().unwrap_or(""))).collect();
    assert_eq!(failed, [(7, "zero.jpg"), (8, "cut.jpg"), (9, "bomb.png")]);
    let cause = |k: usize| out.failures[k].batch_item().map(|(_, e)| e);
    assert!(matches!(cause(0), Some(Error::Empty { .. })));
    assert!(matches!(cause(1), Some(Error::Decode { .. })));
    assert!(matches!(cause(2), Some(Error::LimitExceeded { .. })));
    for i in [7, 8, 9] {
        assert!(out.buffer.outer_slot(i).unwrap().iter().all(|&v| v == 0), "slot {i} not zeroed");
    }
    assert!(out.buffer.outer_slot(10).unwrap().iter().any(|&v| v != 0));
}
