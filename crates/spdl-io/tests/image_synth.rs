//! The synthetic dataset writer: ImageNet-style tree, deterministic, idempotent, decodable.
#![cfg(feature = "synth")]

use spdl_io::image::{ImageFormat, image_info};
use spdl_io::synth;

#[test]
fn dataset_tree_is_deterministic_and_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let paths = synth::write_dataset(dir.path(), 12, 5, 3).unwrap();
    assert_eq!(paths.len(), 12);
    assert!(paths[4].ends_with("class_001/img_00004.jpg"), "{:?}", paths[4]);
    let mut total = 0;
    let mut stamps = Vec::new();
    for p in &paths {
        let bytes = std::fs::read(p).unwrap();
        total += bytes.len();
        let info = image_info(&bytes, &p.display().to_string()).unwrap();
        assert_eq!(info.format, ImageFormat::Jpeg);
        assert!((350..=640).contains(&info.width) && (260..=500).contains(&info.height), "{info:?}");
        stamps.push(std::fs::metadata(p).unwrap().modified().unwrap());
    }
    // Photo-like content compresses like photos (ImageNet averages ~110 KB), not like flat colors.
    let mean = total / paths.len();
    eprintln!("mean JPEG size: {mean} bytes");
    assert!((30_000..300_000).contains(&mean), "mean JPEG size {mean} bytes");

    // A second run keeps every complete file; a damaged file is rewritten with the same bytes.
    let original = std::fs::read(&paths[7]).unwrap();
    std::fs::write(&paths[7], &original[..original.len() / 3]).unwrap();
    let again = synth::write_dataset(dir.path(), 12, 5, 3).unwrap();
    assert_eq!(again, paths);
    assert_eq!(std::fs::read(&paths[7]).unwrap(), original);
    for (i, p) in paths.iter().enumerate() {
        if i != 7 {
            assert_eq!(std::fs::metadata(p).unwrap().modified().unwrap(), stamps[i], "{p:?} was rewritten");
        }
    }
    // No temporary files are left behind.
    for class in std::fs::read_dir(dir.path()).unwrap() {
        for f in std::fs::read_dir(class.unwrap().path()).unwrap() {
            let name = f.unwrap().file_name().into_string().unwrap();
            assert!(name.starts_with("img_") && name.ends_with(".jpg"), "{name}");
        }
    }
    // Same seed, same bytes, in another directory.
    let other = tempfile::tempdir().unwrap();
    let p2 = synth::write_dataset(other.path(), 12, 5, 3).unwrap();
    assert_eq!(std::fs::read(&p2[3]).unwrap(), std::fs::read(&paths[3]).unwrap());
}

#[test]
fn every_format_encodes_and_is_recognised() {
    let (w, h) = (50, 40);
    let px = synth::photo(1, w, h);
    for format in ImageFormat::ALL {
        let bytes = synth::encode(&px, w, h, format).unwrap();
        assert_eq!(ImageFormat::detect(&bytes), Some(format));
        let info = image_info(&bytes, "x").unwrap();
        assert_eq!((info.width, info.height), (w, h));
    }
    let progressive = synth::encode_jpeg(&px, w, h, 80, true).unwrap();
    assert!(progressive.windows(2).any(|m| m == [0xFF, 0xC2]));
}
