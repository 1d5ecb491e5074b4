//! [`LocalStore`]: a directory on the local file system as an object store.

use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use spdl_buffer::file::{BoundedRead, FileKind, OnWouldBlock, ReadBoundError, open_nonblocking, read_bounded};
use tokio::sync::Semaphore;

use super::{ObjectMeta, ObjectStore, StoreOptions, check_range_order, clamp_range};
use crate::error::{Result, SourceError};
use crate::walk::{Walker, check_relative};

/// Keys listed per blocking batch; the walk runs ahead of the consumer by at most a few batches.
const LIST_BATCH: usize = 256;

/// Objects are the regular files under a root directory; keys are their `/`-separated relative paths.
///
/// Reads run on tokio's blocking pool, at most [`StoreOptions::max_in_flight`] at once. Local reads are not
/// retried: a failing disk does not get better in 100 ms. Keys with `..` or a leading `/` are refused.
///
/// Every cost is bounded before it is paid:
///
/// - A key that resolves outside the root through a symbolic link is refused with [`SourceError::OutsideRoot`]
///   (and left out of listings) unless [`StoreOptions::follow_links_outside_root`] is set.
/// - A FIFO, device or socket is refused with [`SourceError::NotRegularFile`], from its metadata, before it is
///   opened (so a FIFO without a writer cannot block), unless [`StoreOptions::special_file_limit`] allows it: then
///   it is opened without blocking and read up to that many bytes, giving up after
///   [`StoreOptions::read_timeout`] without data.
/// - A file larger than [`StoreOptions::max_object_size`] is refused with [`SourceError::ObjectTooLarge`] from its
///   metadata, before anything is allocated; so is a range longer than that.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use spdl_source::{LocalStore, ObjectStore};
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("hello.txt"), b"hello world")?;
/// let store = LocalStore::new(dir.path())?;
/// assert_eq!(&store.get("hello.txt").await?[..], b"hello world");
/// assert_eq!(&store.get_range("hello.txt", 6..11).await?[..], b"world");
/// assert_eq!(store.head("hello.txt").await?.size, 11);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
    limiter: Arc<Semaphore>,
    policy: Arc<Policy>,
}

/// What a read may do, shared with the blocking tasks.
#[derive(Debug)]
struct Policy {
    /// The root resolved, when links out of it are refused.
    confine_to: Option<PathBuf>,
    max_object_size: u64,
    special_file_limit: Option<u64>,
    /// Longest wait for data from a special file.
    special_timeout: Duration,
}

/// What a key resolved to.
#[derive(Debug)]
enum Target {
    Regular { size: u64 },
    Special { kind: &'static str },
}

impl LocalStore {
    /// A store over `root` with default options. The directory must exist.
    pub fn new(root: impl Into<PathBuf>) -> Result<Self> {
        Self::with_options(root, &StoreOptions::default())
    }

    /// A store over `root`. Of `opts`, `max_in_flight`, `max_object_size`, `follow_links_outside_root`,
    /// `special_file_limit` and `read_timeout` (the longest wait for a special file's data) apply.
    pub fn with_options(root: impl Into<PathBuf>, opts: &StoreOptions) -> Result<Self> {
        let root = root.into();
        let meta = std::fs::metadata(&root).map_err(|e| SourceError::io("open", &root, e))?;
        if !meta.is_dir() {
            return Err(SourceError::Io {
                operation: "open",
                path: root,
                source: std::io::Error::new(std::io::ErrorKind::NotADirectory, "a local store's root is a directory"),
            });
        }
        let confine_to = if opts.follow_links_outside_root {
            None
        } else {
            Some(std::fs::canonicalize(&root).map_err(|e| SourceError::io("open", &root, e))?)
        };
        let policy = Policy {
            confine_to,
            max_object_size: opts.max_object_size,
            special_file_limit: opts.special_file_limit,
            special_timeout: opts.read_timeout,
        };
        Ok(LocalStore { root, limiter: super::limiter(opts.max_in_flight), policy: Arc::new(policy) })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file a key names, after checking that the key stays under the root (lexically: links are checked when
    /// the file is read).
    pub fn path_of(&self, key: &str) -> Result<PathBuf> {
        check_relative(key, false)?;
        Ok(self.root.join(key))
    }

    /// Runs blocking file work on tokio's blocking pool while holding one in-flight slot.
    async fn blocking<T: Send + 'static>(
        &self,
        key: &str,
        work: impl FnOnce(&Policy) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let _permit = self
            .limiter
            .acquire()
            .await
            .map_err(|e| SourceError::Task { location: self.location(key), reason: e.to_string() })?;
        let policy = Arc::clone(&self.policy);
        tokio::task::spawn_blocking(move || work(&policy))
            .await
            .map_err(|e| SourceError::Task { location: self.location(key), reason: e.to_string() })?
    }
}

impl Policy {
    /// Checks where `path` leads and what it is, from metadata only (nothing is opened).
    fn resolve(&self, path: &Path) -> Result<Target> {
        if let Some(root) = &self.confine_to {
            let target = std::fs::canonicalize(path).map_err(|e| SourceError::io("stat", path, e))?;
            if !target.starts_with(root) {
                return Err(SourceError::OutsideRoot {
                    location: path.display().to_string(),
                    target: target.display().to_string(),
                    root: root.display().to_string(),
                });
            }
        }
        let meta = std::fs::metadata(path).map_err(|e| SourceError::io("stat", path, e))?;
        match FileKind::of(&meta) {
            FileKind::Directory => Err(SourceError::NotFound { location: path.display().to_string() }),
            FileKind::Regular { size } => Ok(Target::Regular { size }),
            kind => Ok(Target::Special { kind: describe(kind) }),
        }
    }

    fn too_large(&self, path: &Path, size: Option<u64>, limit: u64) -> SourceError {
        let hint = if size.is_some() || limit == self.max_object_size {
            " (raise the store's max_object_size to read it)"
        } else {
            " (raise the store's special_file_limit to read it)"
        };
        SourceError::ObjectTooLarge { location: path.display().to_string(), size, limit, hint }
    }

    /// Refuses a regular file above the size cap, from its size.
    fn check_size(&self, path: &Path, size: u64) -> Result<()> {
        if size > self.max_object_size {
            return Err(self.too_large(path, Some(size), self.max_object_size));
        }
        Ok(())
    }

    /// Reads the whole object `path` names.
    fn read(&self, path: &Path) -> Result<Bytes> {
        match self.resolve(path)? {
            Target::Regular { size } => {
                self.check_size(path, size)?;
                let file = std::fs::File::open(path).map_err(|e| SourceError::io("open", path, e))?;
                // The file may grow after the stat: read one byte past the cap at most.
                let bound = BoundedRead::new(self.max_object_size).size_hint(size);
                let buf = read_bounded(file, &bound).map_err(|e| self.read_error(path, "file", e))?;
                Ok(Bytes::from(buf))
            }
            Target::Special { kind } => self.read_special(path, kind, u64::MAX),
        }
    }

    /// Reads bytes `range` of the object `path` names.
    fn read_range(&self, path: &Path, range: Range<u64>) -> Result<Bytes> {
        let size = match self.resolve(path)? {
            Target::Regular { size } => size,
            Target::Special { kind } => {
                let data = self.read_special(path, kind, range.end)?;
                let size = data.len() as u64;
                let range = clamp_range(|| path.display().to_string(), range, size)?;
                // Both bounds are within `data.len()`, a usize.
                return Ok(data.slice(range.start as usize..range.end as usize));
            }
        };
        let range = clamp_range(|| path.display().to_string(), range, size)?;
        self.check_size(path, range.end - range.start)?;
        let len = usize::try_from(range.end - range.start).map_err(|_| SourceError::InvalidRange {
            location: path.display().to_string(),
            range: range.clone(),
            size: Some(size),
        })?;
        let mut file = std::fs::File::open(path).map_err(|e| SourceError::io("open", path, e))?;
        let mut buf = vec![0u8; len];
        file.seek(SeekFrom::Start(range.start)).map_err(|e| SourceError::io("read", path, e))?;
        file.read_exact(&mut buf).map_err(|e| SourceError::io("read", path, e))?;
        Ok(Bytes::from(buf))
    }

    /// The metadata of the object `path` names.
    fn stat(&self, path: &Path, key: &str) -> Result<ObjectMeta> {
        match self.resolve(path)? {
            Target::Regular { size } => Ok(ObjectMeta::new(key, size)),
            Target::Special { kind } if self.special_file_limit.is_none() => {
                Err(SourceError::NotRegularFile { location: path.display().to_string(), kind })
            }
            // A special file has no size before it is read.
            Target::Special { .. } => Ok(ObjectMeta::new(key, 0)),
        }
    }

    /// Reads a FIFO, device or socket when allowed: opened without blocking, read until its end, `want` bytes or
    /// the special-file limit (past it is an error), giving up after `special_timeout` without data.
    fn read_special(&self, path: &Path, kind: &'static str, want: u64) -> Result<Bytes> {
        let Some(limit) = self.special_file_limit else {
            return Err(SourceError::NotRegularFile { location: path.display().to_string(), kind });
        };
        let file = open_nonblocking(path).map_err(|e| SourceError::io("open", path, e))?;
        let bound = BoundedRead::new(limit).want(want).on_would_block(OnWouldBlock::Wait(self.special_timeout));
        let buf = read_bounded(file, &bound).map_err(|e| self.read_error(path, kind, e))?;
        Ok(Bytes::from(buf))
    }

    /// A [`read_bounded`] failure on `path` (a `kind` file) as the store's error.
    fn read_error(&self, path: &Path, kind: &str, err: ReadBoundError) -> SourceError {
        let source = match err {
            ReadBoundError::TooLarge { limit, .. } => return self.too_large(path, None, limit),
            ReadBoundError::TimedOut { waited } => {
                std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no data from the {kind} for {waited:?}"))
            }
            ReadBoundError::Io(e) => e,
            other => std::io::Error::new(std::io::ErrorKind::OutOfMemory, other),
        };
        SourceError::Io { operation: "read", path: path.to_path_buf(), source }
    }
}

/// The words errors use for a file that is neither regular nor a directory.
fn describe(kind: FileKind) -> &'static str {
    match kind {
        FileKind::Fifo => "FIFO",
        FileKind::CharDevice => "character device",
        FileKind::BlockDevice => "block device",
        FileKind::Socket => "socket",
        FileKind::Regular { .. } | FileKind::Directory | FileKind::Other => "special file",
    }
}

/// The kind of a file that is neither regular nor a directory, for errors.
pub(crate) fn special_kind(meta: &std::fs::Metadata) -> &'static str {
    describe(FileKind::of(meta))
}

impl ObjectStore for LocalStore {
    fn location(&self, key: &str) -> String {
        self.root.join(key).display().to_string()
    }

    fn max_object_size(&self) -> Option<u64> {
        Some(self.policy.max_object_size)
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Bytes>> {
        Box::pin(async move {
            let path = self.path_of(key)?;
            self.blocking(key, move |policy| policy.read(&path)).await
        })
    }

    fn get_range<'a>(&'a self, key: &'a str, range: Range<u64>) -> BoxFuture<'a, Result<Bytes>> {
        Box::pin(async move {
            let path = self.path_of(key)?;
            check_range_order(|| self.location(key), &range)?;
            self.blocking(key, move |policy| policy.read_range(&path, range)).await
        })
    }

    fn head<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ObjectMeta>> {
        Box::pin(async move {
            let path = self.path_of(key)?;
            let key_owned = key.to_owned();
            self.blocking(key, move |policy| policy.stat(&path, &key_owned)).await
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta>> {
        // The walk runs on the blocking pool in batches; the stream holds the walker between batches.
        let state = Walker::with_confinement(&self.root, prefix, self.policy.confine_to.is_some()).map(Some);
        let stream = futures::stream::unfold(Some(state), move |state| async move {
            let mut walker = match state? {
                Ok(Some(walker)) => walker,
                Ok(None) => return None,
                Err(err) => return Some((vec![Err(err)], None)),
            };
            let batch = tokio::task::spawn_blocking(move || {
                let batch: Vec<Result<ObjectMeta>> = walker
                    .by_ref()
                    .take(LIST_BATCH)
                    .map(|item| item.map(|(key, size)| ObjectMeta::new(key, size)))
                    .collect();
                (batch, walker)
            })
            .await;
            match batch {
                Ok((batch, _)) if batch.is_empty() => None,
                Ok((batch, walker)) => Some((batch, Some(Ok(Some(walker))))),
                Err(e) => {
                    let err = SourceError::Task { location: self.location(prefix), reason: e.to_string() };
                    Some((vec![Err(err)], None))
                }
            }
        });
        Box::pin(futures::StreamExt::flat_map(stream, futures::stream::iter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;

    fn store_with(files: &[(&str, &[u8])]) -> (tempfile::TempDir, LocalStore) {
        let dir = tempfile::tempdir().unwrap();
        for (name, data) in files {
            let p = dir.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, data).unwrap();
        }
        let store = LocalStore::new(dir.path()).unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn get_range_head() {
        let (_dir, store) = store_with(&[("a/b.bin", b"0123456789"), ("empty", b"")]);
        assert_eq!(&store.get("a/b.bin").await.unwrap()[..], b"0123456789");
        assert_eq!(&store.get_range("a/b.bin", 3..7).await.unwrap()[..], b"3456");
        assert_eq!(&store.get_range("a/b.bin", 8..100).await.unwrap()[..], b"89");
        assert_eq!(&store.get_range("a/b.bin", 4..4).await.unwrap()[..], b"");
        assert_eq!(&store.get_range("empty", 0..0).await.unwrap()[..], b"");
        assert!(matches!(store.get_range("empty", 0..10).await, Err(SourceError::InvalidRange { .. })));
        assert!(matches!(store.get_range("a/b.bin", 10..12).await, Err(SourceError::InvalidRange { .. })));
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 7..3;
        assert!(matches!(store.get_range("a/b.bin", reversed).await, Err(SourceError::InvalidRange { .. })));
        assert_eq!(store.head("a/b.bin").await.unwrap(), ObjectMeta::new("a/b.bin", 10));
    }

    #[tokio::test]
    async fn missing_and_escaping_keys() {
        let (_dir, store) = store_with(&[("a/b.bin", b"x")]);
        let err = store.get("a/nope").await.unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert!(err.to_string().contains("a/nope"), "{err}");
        assert!(store.head("a").await.unwrap_err().is_not_found());
        assert!(store.get("a").await.unwrap_err().is_not_found());
        assert!(store.get_range("a", 0..1).await.unwrap_err().is_not_found());
        assert!(matches!(store.get("../secret").await, Err(SourceError::InvalidKey { .. })));
        assert!(matches!(store.get("/etc/passwd").await, Err(SourceError::InvalidKey { .. })));
    }

    #[tokio::test]
    async fn lists_in_batches_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut expected = Vec::new();
        for i in 0..(LIST_BATCH * 2 + 7) {
            let key = format!("d{}/f{i:05}", i % 3);
            std::fs::create_dir_all(dir.path().join(format!("d{}", i % 3))).unwrap();
            std::fs::write(dir.path().join(&key), [1u8; 2]).unwrap();
            expected.push(key);
        }
        expected.sort();
        let store = LocalStore::new(dir.path()).unwrap();
        let listed: Vec<ObjectMeta> = store.list("").try_collect().await.unwrap();
        assert_eq!(listed.iter().map(|m| m.key.clone()).collect::<Vec<_>>(), expected);
        assert!(listed.iter().all(|m| m.size == 2));
        let d1: Vec<ObjectMeta> = store.list("d1/").try_collect().await.unwrap();
        assert_eq!(d1.len(), expected.iter().filter(|k| k.starts_with("d1/")).count());
        let err = store.list("../x").try_collect::<Vec<_>>().await.unwrap_err();
        assert!(matches!(err, SourceError::InvalidKey { .. }));
    }

    #[tokio::test]
    async fn parallel_read_matches_get() {
        let data: Vec<u8> = (0..100_003u32).map(|i| (i * 7 % 251) as u8).collect();
        let (_dir, store) = store_with(&[("big", &data)]);
        let opts = super::super::ParallelRead { chunk_size: 4096, concurrency: 4 };
        assert_eq!(&store.get_parallel("big", opts).await.unwrap()[..], &data[..]);
        let small = super::super::ParallelRead { chunk_size: 1 << 20, concurrency: 4 };
        assert_eq!(&store.get_parallel("big", small).await.unwrap()[..], &data[..]);
    }

    #[test]
    fn root_must_be_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"").unwrap();
        assert!(LocalStore::new(dir.path().join("f")).is_err());
        assert!(LocalStore::new(dir.path().join("missing")).unwrap_err().is_not_found());
    }
}
