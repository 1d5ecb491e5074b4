//! The recipe end to end on real files made here: labels from class folders, list files, broken
//! and hostile entries counted as failed items of their stage while the rest loads, epochs, and
//! options refused before anything is paid.

use std::io::Write;

use spdl_loader::{GpuMode, ImageLoader, ListOptions, Listing, LoaderError, LoaderOptions, eval_transform};

fn opts(batch: usize) -> LoaderOptions {
    LoaderOptions {
        batch_size: batch,
        threads: 2,
        gpu: GpuMode::Off,
        transform: eval_transform(32),
        ..LoaderOptions::default()
    }
}

/// (images, labels, failed slots) over a run.
fn drain(loader: &ImageLoader) -> (usize, Vec<i64>, usize) {
    let (mut n, mut labels, mut failed) = (0, Vec::new(), 0);
    for b in loader.pipeline() {
        let b = b.expect("batch");
        assert_eq!(b.images.len(), b.labels.len());
        n += b.labels.len();
        failed += b.failed;
        labels.extend(b.labels);
    }
    (n, labels, failed)
}

#[test]
fn a_directory_of_class_folders_loads_every_image_with_its_label() {
    let dir = tempfile::tempdir().unwrap();
    spdl_io::synth::write_dataset(dir.path(), 30, 1, 3).unwrap();
    let listing = Listing::open(dir.path().to_str().unwrap(), &ListOptions::default()).unwrap();
    assert_eq!(listing.samples.len(), 30);
    let loader = ImageLoader::new(listing, LoaderOptions { epochs: 2, ..opts(8) }).unwrap();
    let (n, mut labels, failed) = drain(&loader);
    assert_eq!((n, failed), (60, 0));
    labels.sort_unstable();
    labels.dedup();
    assert_eq!(labels, [0, 1, 2]);
    assert_eq!(loader.failed_images(), 0);
    assert!(loader.batch_pool_stats().is_some());
}

#[test]
fn broken_and_hostile_entries_fail_alone_in_their_stage() {
    let dir = tempfile::tempdir().unwrap();
    let paths = spdl_io::synth::write_dataset(&dir.path().join("imgs"), 12, 2, 1).unwrap();
    // A truncated JPEG (decode failure), a missing file and a FIFO (read failures).
    let bytes = std::fs::read(&paths[0]).unwrap();
    std::fs::write(dir.path().join("cut.jpg"), &bytes[..bytes.len() / 3]).unwrap();
    let fifo = dir.path().join("pipe.jpg");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc_mkfifo(c.as_ptr(), 0o644) }, 0);
    let list = dir.path().join("list.txt");
    let mut f = std::fs::File::create(&list).unwrap();
    for p in &paths {
        writeln!(f, "{}", p.strip_prefix(dir.path()).unwrap().display()).unwrap();
    }
    writeln!(f, "cut.jpg\nmissing.jpg\npipe.jpg").unwrap();
    drop(f);
    let listing = Listing::open(list.to_str().unwrap(), &ListOptions::default()).unwrap();
    assert_eq!(listing.samples.len(), 15);
    let loader = ImageLoader::new(listing, opts(4)).unwrap();
    let (n, _, failed) = drain(&loader);
    // The truncated JPEG may decode in part (a grey tail) or fail: either it is a slot or a failure.
    let stats = loader.pipeline().stats();
    let read_failed = stats.stage("read").unwrap().items_failed;
    let decode_failed = stats.stage("decode").unwrap().items_failed;
    assert_eq!(read_failed, 2, "{stats}");
    assert_eq!(decode_failed as usize, failed);
    assert_eq!(n, 13);
    assert_eq!(loader.failed_images(), read_failed + decode_failed);
}

#[test]
fn list_files_may_name_files_anywhere() {
    let data = tempfile::tempdir().unwrap();
    let lists = tempfile::tempdir().unwrap();
    let paths = spdl_io::synth::write_dataset(data.path(), 5, 3, 1).unwrap();
    let list = lists.path().join("abs.txt");
    std::fs::write(&list, paths.iter().map(|p| format!("{}\n", p.display())).collect::<String>()).unwrap();
    let listing = Listing::open(list.to_str().unwrap(), &ListOptions::default()).unwrap();
    let loader = ImageLoader::new(listing, opts(2)).unwrap();
    assert_eq!(drain(&loader).0, 5);
}

#[test]
fn bad_options_and_listings_are_errors_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    spdl_io::synth::write_dataset(dir.path(), 3, 4, 1).unwrap();
    let listing = || Listing::open(dir.path().to_str().unwrap(), &ListOptions::default()).unwrap();
    for bad in [
        LoaderOptions { threads: 0, ..opts(2) },
        LoaderOptions { threads: 100_000, ..opts(2) },
        LoaderOptions { io_concurrency: Some(0), ..opts(2) },
        LoaderOptions { epochs: 0, ..opts(2) },
        opts(0),
        LoaderOptions { transform: eval_transform(60_000), ..opts(60_000) },
    ] {
        let err = ImageLoader::new(listing(), bad).unwrap_err();
        assert!(matches!(err, LoaderError::InvalidOption { .. }), "{err}");
    }
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(
        Listing::open(empty.path().to_str().unwrap(), &ListOptions::default()),
        Err(LoaderError::Empty { .. })
    ));
    assert!(Listing::open("/dev/zero", &ListOptions::default()).is_err());
    assert!(Listing::open(dir.path().join("nope").to_str().unwrap(), &ListOptions::default()).is_err());
}

unsafe extern "C" {
    #[link_name = "mkfifo"]
    fn libc_mkfifo(path: *const std::ffi::c_char, mode: u32) -> i32;
}
