//! The process-wide decode memory budget (its own test binary: the budget is global to the process).
#![cfg(feature = "image")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use spdl_buffer::system_allocator;
use spdl_io::image::{BatchDecoder, BatchOptions, ImageOptions, Transform, decode_image};
use spdl_io::{Error, decode_memory_budget, set_decode_memory_budget};

fn gray_png(w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Grayscale);
        enc.set_compression(png::Compression::Fast);
        let mut writer = enc.write_header().unwrap_or_else(|e| panic!("{e}"));
        writer.write_image_data(&vec![7u8; (w as usize) * (h as usize)]).unwrap_or_else(|e| panic!("{e}"));
    }
    out
}

#[test]
fn budget_bounds_concurrent_decodes_and_refuses_what_never_fits() {
    let before = decode_memory_budget();
    // 3000 x 3000 gray decoded to RGB: about 9 M pixels x (gray + 8-bit copy + RGB) = 80+ MB of working set.
    let big = gray_png(3000, 3000);

    set_decode_memory_budget(32 << 20).unwrap_or_else(|e| panic!("{e}"));
    let err = decode_image(&big, "big.png", &ImageOptions::default(), &Transform::resize(64, 64), &system_allocator());
    let err = err.err().unwrap_or_else(|| panic!("decoded over the budget"));
    assert!(matches!(err, Error::LimitExceeded { ref what, .. } if what == "decode memory bytes"), "{err}");
    assert!(err.to_string().contains("big.png"), "{err}");

    // A budget that fits one such decode at a time: four of them on four threads all decode (waiting
    // for each other), and every pixel is right.
    set_decode_memory_budget(160 << 20).unwrap_or_else(|e| panic!("{e}"));
    let dec = BatchDecoder::new(
        BatchOptions { transform: Transform::resize(32, 32), threads: Some(4), ..BatchOptions::default() },
        system_allocator(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let items: Vec<(String, &[u8])> = (0..4).map(|i| (format!("{i}.png"), big.as_slice())).collect();
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let done = done.clone();
        std::thread::spawn(move || {
            for _ in 0..1200 {
                if done.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            eprintln!("decodes under the budget did not finish in 120 s");
            std::process::exit(1);
        })
    };
    let out = dec.decode(&items).unwrap_or_else(|e| panic!("{e}"));
    done.store(true, Ordering::Relaxed);
    let _ = watchdog.join();
    assert!(out.failures.is_empty());
    assert!(out.buffer.as_bytes().iter().all(|&v| v == 7));

    set_decode_memory_budget(before).unwrap_or_else(|e| panic!("{e}"));
    assert!(set_decode_memory_budget(1).is_err());
}
