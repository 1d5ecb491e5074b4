//! The local store and the dataset walker against hostile file trees: symbolic links into other class folders
//! and out of the root, FIFOs without a writer, `/dev/zero`, files over the size cap, a root that is not a
//! directory. Every call must end, in bounded time and memory, with the right data or a typed error naming the
//! key. Each test body runs under a watchdog, so a hang fails instead of stalling CI.
#![cfg(unix)]

use std::os::unix::fs::{OpenOptionsExt, symlink};
use std::path::Path;
use std::time::{Duration, Instant};

use spdl_source::{Dataset, LocalStore, ObjectStore, ParallelRead, SourceError, StoreOptions};

/// Runs `body` on a runtime of its own on another thread; fails the test if it does not finish within `limit`.
fn watchdog<F, Fut>(limit: Duration, body: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(body());
        let _ = tx.send(());
    });
    match rx.recv_timeout(limit) {
        Ok(()) => handle.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            // The body panicked: re-raise its panic here.
            if let Err(panic) = handle.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("test body hung for more than {limit:?}"),
    }
}

fn write(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}: {}", path.display(), std::io::Error::last_os_error());
}

const LIMIT: Duration = Duration::from_secs(20);

#[test]
fn a_link_to_another_class_never_takes_its_place() {
    watchdog(LIMIT, || async {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("train");
        for class in ["a", "b", "c", "d"] {
            write(&root, &format!("{class}/{class}1.jpg"), class.as_bytes());
        }
        // `a/also_c` sorts before `c`: it used to claim c's folder, dropping class c and shifting d's label.
        symlink("../c", root.join("a/also_c")).unwrap();
        // A loop back to the root, and a link from one class to the whole tree.
        symlink("..", root.join("b/up")).unwrap();
        symlink(&root, root.join("d/everything")).unwrap();
        let ds = Dataset::image_folder(&root, &["jpg"]).unwrap();
        assert_eq!(ds.classes(), ["a", "b", "c", "d"]);
        let got: Vec<(&str, Option<i64>)> = ds.iter().map(|r| (r.key.as_str(), r.label)).collect();
        assert_eq!(got, [("a/a1.jpg", Some(0)), ("b/b1.jpg", Some(1)), ("c/c1.jpg", Some(2)), ("d/d1.jpg", Some(3))]);
        // The store lists the same files once each.
        let store = LocalStore::new(&root).unwrap();
        let listed = Dataset::from_store(&store, "", &["jpg"], spdl_source::FolderLayout::ClassFolders).await.unwrap();
        assert_eq!(listed, ds);
    });
}

#[test]
fn links_out_of_the_root_are_class_folders_for_datasets_and_refused_by_stores() {
    watchdog(LIMIT, || async {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("train");
        let outside = dir.path().join("elsewhere");
        write(&root, "a/1.jpg", b"a");
        write(&outside, "e/2.jpg", b"e");
        write(&outside, "secret.txt", b"secret");
        symlink(outside.join("e"), root.join("e")).unwrap();
        symlink(outside.join("secret.txt"), root.join("a/secret.jpg")).unwrap();
        // A loop outside the root ends.
        symlink(outside.join("e"), outside.join("e/again")).unwrap();

        // A dataset listing follows links to folders kept elsewhere (a common way to assemble a training set).
        let ds = Dataset::image_folder(&root, &["jpg"]).unwrap();
        assert_eq!(ds.classes(), ["a", "e"]);
        let keys: Vec<&str> = ds.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["a/1.jpg", "a/secret.jpg", "e/2.jpg"]);

        // A store does not leave its root: keys through such links are refused, and not listed.
        let store = LocalStore::new(&root).unwrap();
        for key in ["a/secret.jpg", "e/2.jpg"] {
            let err = store.get(key).await.unwrap_err();
            assert!(matches!(err, SourceError::OutsideRoot { .. }), "{key}: {err}");
            assert!(err.to_string().contains(key), "{err}");
            assert!(matches!(store.head(key).await, Err(SourceError::OutsideRoot { .. })));
            assert!(matches!(store.get_range(key, 0..1).await, Err(SourceError::OutsideRoot { .. })));
        }
        let listed = Dataset::from_store(&store, "", &[], spdl_source::FolderLayout::Flat).await.unwrap();
        assert_eq!(listed.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(), ["a/1.jpg"]);
        let listed = Dataset::from_store(&store, "e/", &[], spdl_source::FolderLayout::Flat).await.unwrap();
        assert!(listed.is_empty());

        // Unless the caller opts in.
        let opts = StoreOptions::default().follow_links_outside_root(true);
        let store = LocalStore::with_options(&root, &opts).unwrap();
        assert_eq!(&store.get("a/secret.jpg").await.unwrap()[..], b"secret");
        assert_eq!(&store.get("e/2.jpg").await.unwrap()[..], b"e");
        let listed = Dataset::from_store(&store, "", &[], spdl_source::FolderLayout::Flat).await.unwrap();
        assert_eq!(listed.len(), 3);
    });
}

#[test]
fn a_root_that_is_not_a_directory_is_an_error() {
    watchdog(LIMIT, || async {
        for path in ["/dev/null".into(), tempfile::NamedTempFile::new().unwrap().path().to_path_buf()] {
            let err = Dataset::from_dir(&path, &[]).unwrap_err();
            let SourceError::Io { source, .. } = &err else { panic!("{}: {err}", path.display()) };
            assert_eq!(source.kind(), std::io::ErrorKind::NotADirectory, "{err}");
            assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
            assert!(Dataset::image_folder(&path, &["jpg"]).is_err());
        }
        assert!(Dataset::from_dir("/nonexistent/spdl/root", &[]).unwrap_err().is_not_found());
    });
}

#[test]
fn fifos_and_devices_are_refused_without_blocking() {
    watchdog(LIMIT, || async {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "ok.bin", b"ok");
        mkfifo(&dir.path().join("pipe"));
        symlink("/dev/zero", dir.path().join("zero")).unwrap();

        // Confined (the default): /dev/zero is outside the root.
        let store = LocalStore::new(dir.path()).unwrap();
        let start = Instant::now();
        let err = store.get("pipe").await.unwrap_err();
        assert!(matches!(err, SourceError::NotRegularFile { kind: "FIFO", .. }), "{err}");
        assert!(err.to_string().contains("pipe") && err.to_string().contains("not a regular file"), "{err}");
        assert!(matches!(store.head("pipe").await, Err(SourceError::NotRegularFile { .. })));
        assert!(matches!(store.get_range("pipe", 0..4).await, Err(SourceError::NotRegularFile { .. })));
        assert!(matches!(store.get("zero").await, Err(SourceError::OutsideRoot { .. })));
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
        let listed = Dataset::from_store(&store, "", &[], spdl_source::FolderLayout::Flat).await.unwrap();
        assert_eq!(listed.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(), ["ok.bin"]);

        // Links followed, still no special files.
        let opts = StoreOptions::default().follow_links_outside_root(true);
        let store = LocalStore::with_options(dir.path(), &opts).unwrap();
        let err = store.get("zero").await.unwrap_err();
        assert!(matches!(err, SourceError::NotRegularFile { kind: "character device", .. }), "{err}");
        assert!(err.to_string().contains("zero"), "{err}");

        // Special files allowed up to 64 KiB: an endless device stops at the limit, a FIFO without a writer ends.
        let opts = opts.special_file_limit(Some(64 << 10)).read_timeout(Duration::from_millis(300));
        let store = LocalStore::with_options(dir.path(), &opts).unwrap();
        let err = store.get("zero").await.unwrap_err();
        assert!(matches!(err, SourceError::ObjectTooLarge { size: None, limit: 65536, .. }), "{err}");
        assert_eq!(&store.get_range("zero", 100..200).await.unwrap()[..], &[0u8; 100][..]);
        let start = Instant::now();
        assert!(store.get("pipe").await.unwrap().is_empty());
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    });
}

#[test]
fn a_fifo_with_a_silent_writer_times_out() {
    watchdog(LIMIT, || async {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("pipe");
        mkfifo(&pipe);
        // Holds the FIFO open for writing and never writes.
        let writer_pipe = pipe.clone();
        let (opened_tx, opened_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let writer = std::thread::spawn(move || {
            let f = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&writer_pipe).or_else(
                |_| {
                    // No reader yet: open blocking, which a reader below releases.
                    std::fs::OpenOptions::new().write(true).open(&writer_pipe)
                },
            );
            let _ = opened_tx.send(());
            let _ = done_rx.recv_timeout(Duration::from_secs(10));
            drop(f);
        });
        // A reader that holds the FIFO open lets the writer's open return.
        let keep_reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&pipe).unwrap();
        opened_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let opts = StoreOptions::default().special_file_limit(Some(1024)).read_timeout(Duration::from_millis(300));
        let store = LocalStore::with_options(dir.path(), &opts).unwrap();
        let start = Instant::now();
        let err = store.get("pipe").await.unwrap_err();
        let elapsed = start.elapsed();
        assert!(
            matches!(&err, SourceError::Io { source, .. } if source.kind() == std::io::ErrorKind::TimedOut),
            "{err}"
        );
        assert!(elapsed >= Duration::from_millis(250) && elapsed < Duration::from_secs(3), "{elapsed:?}");
        drop(keep_reader);
        let _ = done_tx.send(());
        writer.join().unwrap();
    });
}

#[test]
fn objects_over_the_size_cap_are_refused_from_their_metadata() {
    watchdog(LIMIT, || async {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "small.bin", &[1u8; 10]);
        write(dir.path(), "big.bin", &[2u8; 11]);
        // A sparse file of 1 TiB: refused from its size, nothing allocated.
        let sparse = std::fs::File::create(dir.path().join("huge.bin")).unwrap();
        sparse.set_len(1 << 40).unwrap();
        let store = LocalStore::with_options(dir.path(), &StoreOptions::default().max_object_size(10)).unwrap();
        assert_eq!(store.max_object_size(), Some(10));
        assert_eq!(store.get("small.bin").await.unwrap().len(), 10);
        for key in ["big.bin", "huge.bin"] {
            let err = store.get(key).await.unwrap_err();
            assert!(matches!(err, SourceError::ObjectTooLarge { size: Some(_), limit: 10, .. }), "{err}");
            assert!(err.to_string().contains(key) && err.to_string().contains("max_object_size"), "{err}");
            let opts = ParallelRead { chunk_size: 4, concurrency: 2 };
            assert!(matches!(store.get_parallel(key, opts).await, Err(SourceError::ObjectTooLarge { .. })));
        }
        assert_eq!(store.get_range("big.bin", 0..5).await.unwrap().len(), 5);
        assert!(matches!(store.get_range("big.bin", 0..11).await, Err(SourceError::ObjectTooLarge { .. })));
        // The default cap refuses the sparse terabyte too.
        let store = LocalStore::new(dir.path()).unwrap();
        let err = store.get("huge.bin").await.unwrap_err();
        assert!(matches!(err, SourceError::ObjectTooLarge { limit: spdl_source::DEFAULT_MAX_OBJECT_SIZE, .. }));
        assert_eq!(store.head("huge.bin").await.unwrap().size, 1 << 40);
    });
}

#[test]
fn manifests_that_never_end_are_refused() {
    watchdog(LIMIT, || async {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("keys.txt");
        mkfifo(&pipe);
        let err = Dataset::from_manifest(&pipe).unwrap_err();
        assert!(matches!(err, SourceError::NotRegularFile { kind: "FIFO", .. }), "{err}");
        let err = Dataset::from_manifest("/dev/zero").unwrap_err();
        assert!(matches!(err, SourceError::NotRegularFile { kind: "character device", .. }), "{err}");
        assert!(err.to_string().contains("/dev/zero"), "{err}");
        write(dir.path(), "ok.txt", b"a.jpg\nb.jpg\n");
        assert_eq!(Dataset::from_manifest(dir.path().join("ok.txt")).unwrap().len(), 2);
    });
}
