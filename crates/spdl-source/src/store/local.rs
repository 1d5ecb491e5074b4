//! [`LocalStore`]: a directory on the local file system as an object store.

use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
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
}

impl LocalStore {
    /// A store over `root` with default options. The directory must exist.
    pub fn new(root: impl Into<PathBuf>) -> Result<Self> {
        Self::with_options(root, &StoreOptions::default())
    }

    /// A store over `root`; only `max_in_flight` of `opts` applies to local reads.
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
        Ok(LocalStore { root, limiter: super::limiter(opts.max_in_flight) })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file a key names, after checking that the key stays under the root.
    pub fn path_of(&self, key: &str) -> Result<PathBuf> {
        check_relative(key, false)?;
        Ok(self.root.join(key))
    }

    /// Runs blocking file work on tokio's blocking pool while holding one in-flight slot.
    async fn blocking<T: Send + 'static>(
        &self,
        key: &str,
        work: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let _permit = self
            .limiter
            .acquire()
            .await
            .map_err(|e| SourceError::Task { location: self.location(key), reason: e.to_string() })?;
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|e| SourceError::Task { location: self.location(key), reason: e.to_string() })?
    }
}

fn read_range(path: &Path, range: Range<u64>) -> Result<Bytes> {
    let mut file = std::fs::File::open(path).map_err(|e| SourceError::io("open", path, e))?;
    let meta = file.metadata().map_err(|e| SourceError::io("stat", path, e))?;
    if !meta.is_file() {
        return Err(SourceError::NotFound { location: path.display().to_string() });
    }
    let size = meta.len();
    let range = clamp_range(|| path.display().to_string(), range, size)?;
    let len = usize::try_from(range.end - range.start).map_err(|_| SourceError::InvalidRange {
        location: path.display().to_string(),
        range: range.clone(),
        size: Some(size),
    })?;
    let mut buf = vec![0u8; len];
    file.seek(SeekFrom::Start(range.start)).map_err(|e| SourceError::io("read", path, e))?;
    file.read_exact(&mut buf).map_err(|e| SourceError::io("read", path, e))?;
    Ok(Bytes::from(buf))
}

fn stat(path: &Path, key: &str) -> Result<ObjectMeta> {
    let meta = std::fs::metadata(path).map_err(|e| SourceError::io("stat", path, e))?;
    if !meta.is_file() {
        return Err(SourceError::NotFound { location: path.display().to_string() });
    }
    Ok(ObjectMeta::new(key, meta.len()))
}

impl ObjectStore for LocalStore {
    fn location(&self, key: &str) -> String {
        self.root.join(key).display().to_string()
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Bytes>> {
        Box::pin(async move {
            let path = self.path_of(key)?;
            self.blocking(key, move || {
                std::fs::read(&path).map(Bytes::from).map_err(|e| SourceError::io("read", &path, e))
            })
            .await
        })
    }

    fn get_range<'a>(&'a self, key: &'a str, range: Range<u64>) -> BoxFuture<'a, Result<Bytes>> {
        Box::pin(async move {
            let path = self.path_of(key)?;
            check_range_order(|| self.location(key), &range)?;
            self.blocking(key, move || read_range(&path, range)).await
        })
    }

    fn head<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ObjectMeta>> {
        Box::pin(async move {
            let path = self.path_of(key)?;
            let key_owned = key.to_owned();
            self.blocking(key, move || stat(&path, &key_owned)).await
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta>> {
        // The walk runs on the blocking pool in batches; the stream holds the walker between batches.
        let state = Walker::new(&self.root, prefix).map(Some);
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
