//! WebDataset tar shards: files grouped into samples by basename, read straight from the tar stream.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};

use crate::error::{Result, SourceError};
use crate::store::ObjectStore;
use crate::tar_index::{TarReadError, TarReader};

/// Samples decoded ahead of the consumer per [`stream_shards`] stream.
const STREAM_AHEAD: usize = 32;

/// One WebDataset sample: the files of a shard that share a key, by extension.
///
/// `train/00042.jpg` and `train/00042.cls` make the sample with key `train/00042` and files `jpg` and `cls`. The
/// key is the path up to the first dot of the file name; the extension is the rest, lowercased (so
/// `00042.seg.png` has extension `seg.png`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WdsSample {
    /// The sample's key.
    pub key: String,
    /// The shard it came from.
    pub shard: String,
    /// File contents by extension.
    pub files: BTreeMap<String, Bytes>,
}

impl WdsSample {
    /// The contents of the file with extension `ext` (e.g. `"jpg"`, `"cls"`).
    pub fn get(&self, ext: &str) -> Option<&Bytes> {
        self.files.get(ext)
    }
}

/// Reads the samples of one tar shard from any reader (a file, an in-memory object, a pipe), without extracting.
///
/// The tar stream is parsed by [`TarReader`], the crate's one TAR parser: ustar (with its path prefix), GNU long
/// names, PAX `path` and `size` records and base-256 sizes are read; of the members, regular files (types `'0'`,
/// NUL and `'7'`) are kept and the others skipped. A malformed or truncated shard, or a failing reader, ends the
/// iteration with [`SourceError::Tar`], which names the shard and, when the fault is in a member's data or name,
/// the member; its source is an [`std::io::Error`] that carries the [`TarReadError`].
///
/// ```
/// use spdl_source::dataset::ShardReader;
///
/// let mut tar = tar::Builder::new(Vec::new());
/// for (name, data) in [("s0.jpg", &b"img0"[..]), ("s0.cls", b"3"), ("s1.jpg", b"img1"), ("s1.cls", b"5")] {
///     let mut header = tar::Header::new_gnu();
///     header.set_size(data.len() as u64);
///     header.set_cksum();
///     tar.append_data(&mut header, name, data)?;
/// }
/// let bytes = tar.into_inner()?;
///
/// let mut reader = ShardReader::new(&bytes[..], "shard-000000.tar");
/// let samples: Vec<_> = reader.samples()?.collect::<Result<_, _>>()?;
/// assert_eq!(samples.len(), 2);
/// assert_eq!(samples[1].key, "s1");
/// assert_eq!(&samples[1].get("cls").unwrap()[..], b"5");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ShardReader<R: Read> {
    tar: TarReader<R>,
    name: String,
}

impl<R: Read> std::fmt::Debug for ShardReader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardReader").field("name", &self.name).finish_non_exhaustive()
    }
}

impl<R: Read> ShardReader<R> {
    /// A reader over a tar stream; `name` (the shard's key or path) appears in samples and errors.
    pub fn new(reader: R, name: impl Into<String>) -> Self {
        ShardReader { tar: TarReader::new(reader), name: name.into() }
    }

    /// Iterates over the shard's samples, in the order of the tar.
    ///
    /// # Errors
    ///
    /// None at present: the shard's faults are items of the iteration. The `Result` leaves room for readers that
    /// check a shard before its first member.
    pub fn samples(&mut self) -> Result<WdsSamples<'_, R>> {
        Ok(WdsSamples { tar: &mut self.tar, shard: self.name.clone(), pending: None, done: false })
    }
}

/// The samples of a shard; see [`ShardReader::samples`].
pub struct WdsSamples<'a, R: Read> {
    tar: &'a mut TarReader<R>,
    shard: String,
    /// The sample being assembled: consecutive files with its key.
    pending: Option<WdsSample>,
    done: bool,
}

impl<R: Read> std::fmt::Debug for WdsSamples<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WdsSamples").field("shard", &self.shard).finish_non_exhaustive()
    }
}

fn tar_error(shard: &str, entry: Option<String>, source: std::io::Error) -> SourceError {
    SourceError::Tar { shard: shard.to_owned(), entry, source }
}

/// The member a parse error is about, when it names one (a member whose data ends early).
fn faulty_member(err: &TarReadError) -> Option<String> {
    match err {
        TarReadError::Format(crate::tar_index::TarFormatError::TruncatedData { member, .. }) => Some(member.clone()),
        _ => None,
    }
}

/// Splits a member name into (key, extension) by the WebDataset rule, or `None` for files that belong to no
/// sample (no extension, or `__meta__`-style names at the top level).
fn split_name(path: &str) -> Option<(&str, String)> {
    let path = path.trim_start_matches("./");
    let name_start = path.rfind('/').map_or(0, |i| i + 1);
    let name = &path[name_start..];
    if !path.contains('/') && name.starts_with("__") && name.ends_with("__") {
        return None;
    }
    let dot = name.find('.')?;
    if dot == 0 || dot + 1 == name.len() {
        return None;
    }
    Some((&path[..name_start + dot], name[dot + 1..].to_ascii_lowercase()))
}

impl<R: Read> WdsSamples<'_, R> {
    fn fail(&mut self, entry: Option<String>, err: std::io::Error) -> Option<Result<WdsSample>> {
        self.done = true;
        Some(Err(tar_error(&self.shard, entry, err)))
    }

    fn fail_read(&mut self, entry: Option<String>, err: TarReadError) -> Option<Result<WdsSample>> {
        let entry = entry.or_else(|| faulty_member(&err));
        self.fail(entry, err.into())
    }
}

impl<R: Read> Iterator for WdsSamples<'_, R> {
    type Item = Result<WdsSample>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        loop {
            let entry = match self.tar.next_member() {
                Ok(None) => {
                    self.done = true;
                    return self.pending.take().map(Ok);
                }
                Err(e) => return self.fail_read(None, e),
                Ok(Some(entry)) => entry,
            };
            let path = match String::from_utf8(entry.name) {
                Ok(p) => p,
                Err(e) => {
                    let name = String::from_utf8_lossy(e.as_bytes()).into_owned();
                    let err = std::io::Error::new(std::io::ErrorKind::InvalidData, "member name is not UTF-8");
                    return self.fail(Some(name), err);
                }
            };
            let Some((key, ext)) = split_name(&path) else { continue };
            // The buffer grows as the member's bytes arrive: its header's size is not trusted.
            let mut data = Vec::new();
            if let Err(e) = self.tar.read_data(&mut data) {
                return self.fail_read(Some(path), e);
            }
            let data = Bytes::from(data);
            match &mut self.pending {
                Some(sample) if sample.key == key => {
                    if sample.files.insert(ext.clone(), data).is_some() {
                        let msg = format!("sample {key:?} has two files with extension {ext:?}");
                        return self.fail(Some(path), std::io::Error::new(std::io::ErrorKind::InvalidData, msg));
                    }
                }
                _ => {
                    let next = WdsSample {
                        key: key.to_owned(),
                        shard: self.shard.clone(),
                        files: BTreeMap::from([(ext, data)]),
                    };
                    if let Some(done) = self.pending.replace(next) {
                        return Some(Ok(done));
                    }
                }
            }
        }
    }
}

/// Streams the samples of several shards from a store, shard after shard.
///
/// Each shard is fetched whole with [`ObjectStore::get`] and parsed on tokio's blocking pool, at most a few dozen
/// samples ahead of the consumer; memory holds about one shard. A shard that cannot be fetched or parsed yields
/// its error (naming the shard) and the stream goes on with the next one. Must be polled inside a tokio runtime.
pub fn stream_shards(store: Arc<dyn ObjectStore>, shard_keys: Vec<String>) -> BoxStream<'static, Result<WdsSample>> {
    let start = async move {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<WdsSample>>(STREAM_AHEAD);
        if tokio::runtime::Handle::try_current().is_err() {
            let err = SourceError::Task {
                location: shard_keys.first().map(|k| store.location(k)).unwrap_or_default(),
                reason: "stream_shards must be polled inside a tokio runtime".into(),
            };
            let _ = tx.try_send(Err(err));
            return rx;
        }
        tokio::spawn(async move {
            for key in shard_keys {
                let data = match store.get(&key).await {
                    Ok(data) => data,
                    Err(err) => {
                        if tx.send(Err(err)).await.is_err() {
                            return;
                        }
                        continue;
                    }
                };
                let tx_shard = tx.clone();
                let location = store.location(&key);
                let parsed = tokio::task::spawn_blocking(move || {
                    let mut reader = ShardReader::new(&data[..], location);
                    let samples = match reader.samples() {
                        Ok(samples) => samples,
                        Err(err) => return tx_shard.blocking_send(Err(err)).is_ok(),
                    };
                    for sample in samples {
                        // The consumer dropped the stream: stop reading.
                        if tx_shard.blocking_send(sample).is_err() {
                            return false;
                        }
                    }
                    true
                })
                .await;
                match parsed {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(join) => {
                        let err = SourceError::Task { location: store.location(&key), reason: join.to_string() };
                        if tx.send(Err(err)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        rx
    };
    futures::stream::once(start)
        .flat_map(|rx| futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) }))
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalStore;
    use crate::tar_index::{BLOCK, TarFormatError};
    use futures::TryStreamExt;

    fn shard(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            tar.append_data(&mut header, name, *data).unwrap();
        }
        tar.into_inner().unwrap()
    }

    #[test]
    fn names_split_like_webdataset() {
        assert_eq!(split_name("a/b/000.jpg"), Some(("a/b/000", "jpg".into())));
        assert_eq!(split_name("./x.seg.PNG"), Some(("x", "seg.png".into())));
        assert_eq!(split_name("dir.v2/x.cls"), Some(("dir.v2/x", "cls".into())));
        assert_eq!(split_name("noext"), None);
        assert_eq!(split_name(".hidden"), None);
        assert_eq!(split_name("__meta__"), None);
    }

    #[test]
    fn groups_consecutive_files() {
        let long = format!("{}/s9.jpg", "d".repeat(150));
        let bytes = shard(&[
            ("s0.jpg", b"j0"),
            ("s0.cls", b"0"),
            ("s0.json", b"{}"),
            ("s1.jpg", b"j1"),
            ("README", b"skip me"),
            ("s1.cls", b"1"),
            (&long, b"j9"),
        ]);
        let mut reader = ShardReader::new(&bytes[..], "shard-0.tar");
        let samples: Vec<WdsSample> = reader.samples().unwrap().collect::<Result<_>>().unwrap();
        let keys: Vec<&str> = samples.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, ["s0", "s1", &long[..long.len() - 4]]);
        assert_eq!(samples[0].files.keys().collect::<Vec<_>>(), ["cls", "jpg", "json"]);
        assert_eq!(&samples[1].get("cls").unwrap()[..], b"1");
        assert_eq!(samples[2].shard, "shard-0.tar");
    }

    #[test]
    fn duplicate_and_truncated_shards_fail_with_names() {
        let bytes = shard(&[("s0.jpg", b"a"), ("s0.jpg", b"b")]);
        let err = ShardReader::new(&bytes[..], "dup.tar").samples().unwrap().find_map(|r| r.err()).unwrap();
        assert!(err.to_string().contains("dup.tar") && err.to_string().contains("s0.jpg"), "{err}");

        let bytes = shard(&[("s0.jpg", &[7u8; 4000]), ("s1.jpg", b"x")]);
        let cut = &bytes[..1500];
        let results: Vec<Result<WdsSample>> = ShardReader::new(cut, "cut.tar").samples().unwrap().collect();
        let err = results.iter().find_map(|r| r.as_ref().err()).expect("a truncated shard is an error");
        assert!(matches!(err, SourceError::Tar { .. }) && err.to_string().contains("cut.tar"), "{err}");
    }

    /// An error and its causes, as a chain printer writes them.
    fn chain(err: &dyn std::error::Error) -> String {
        let mut text = err.to_string();
        let mut cause = err.source();
        while let Some(c) = cause {
            text.push_str(": ");
            text.push_str(&c.to_string());
            cause = c.source();
        }
        text
    }

    fn samples_of(bytes: &[u8], name: &str) -> Vec<Result<WdsSample>> {
        ShardReader::new(bytes, name).samples().unwrap().collect()
    }

    /// The [`TarReadError`] a shard error carries.
    fn tar_cause(err: &SourceError) -> &TarReadError {
        let SourceError::Tar { source, .. } = err else { panic!("not a tar error: {err}") };
        source.get_ref().and_then(|e| e.downcast_ref::<TarReadError>()).expect("a TarReadError")
    }

    #[test]
    fn pax_paths_gnu_long_names_and_ustar_prefixes_make_keys() {
        let pax_dir = format!("{}/pax", "p".repeat(120));
        let gnu_dir = format!("{}/gnu", "g".repeat(120));
        let ustar_dir = "u".repeat(120);
        let mut tar = tar::Builder::new(Vec::new());
        for (path, data) in [(format!("{pax_dir}/000.jpg"), &b"pj"[..]), (format!("{pax_dir}/000.cls"), b"1")] {
            // A PAX `path` record over a short ustar name, as Python's tarfile writes long paths.
            tar.append_pax_extensions([("path", path.as_bytes())]).unwrap();
            let mut header = tar::Header::new_ustar();
            header.set_path("short").unwrap();
            header.set_size(data.len() as u64);
            header.set_cksum();
            tar.append_data(&mut header, "short", data).unwrap();
        }
        for (path, data) in [(format!("{gnu_dir}/001.jpg"), &b"gj"[..]), (format!("{gnu_dir}/001.cls"), b"2")] {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_cksum();
            tar.append_data(&mut header, path, data).unwrap();
        }
        let mut bytes = tar.into_inner().unwrap();
        bytes.truncate(bytes.len() - 2 * BLOCK);
        // ustar's prefix field: prefix + "/" + name.
        let mut header = tar::Header::new_ustar();
        header.set_path(format!("{ustar_dir}/002.jpg")).unwrap();
        header.set_size(2);
        header.set_cksum();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(b"uj");
        bytes.resize(bytes.len().div_ceil(BLOCK) * BLOCK + 2 * BLOCK, 0);

        let samples: Vec<WdsSample> = samples_of(&bytes, "long.tar").into_iter().collect::<Result<_>>().unwrap();
        let keys: Vec<String> = samples.iter().map(|s| s.key.clone()).collect();
        assert_eq!(keys, [format!("{pax_dir}/000"), format!("{gnu_dir}/001"), format!("{ustar_dir}/002")]);
        assert_eq!(&samples[0].get("jpg").unwrap()[..], b"pj");
        assert_eq!(&samples[0].get("cls").unwrap()[..], b"1");
        assert_eq!(&samples[1].get("cls").unwrap()[..], b"2");
        assert_eq!(&samples[2].get("jpg").unwrap()[..], b"uj");
    }

    #[test]
    fn hostile_shards_fail_with_typed_errors() {
        // Not a tar at all.
        let results = samples_of(&[b'x'; 2048], "junk.tar");
        assert_eq!(results.len(), 1);
        let err = results[0].as_ref().unwrap_err();
        assert!(matches!(err, SourceError::Tar { entry: None, .. }) && err.to_string().contains("junk.tar"), "{err}");
        assert!(matches!(tar_cause(err), TarReadError::Format(TarFormatError::BadChecksum { offset: 0 })));

        // A member that declares 8 GiB: the sample before it, then an error naming the member.
        let mut bytes = shard(&[("s0.jpg", b"a"), ("s1.jpg", b"b")]);
        let at = 2 * BLOCK;
        bytes[at + 124..at + 136].copy_from_slice(b"77777777777\0");
        bytes[at + 148..at + 156].fill(b' ');
        let sum: u64 = bytes[at..at + BLOCK].iter().map(|&b| u64::from(b)).sum();
        bytes[at + 148..at + 156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let results = samples_of(&bytes, "huge.tar");
        assert_eq!(results.len(), 1, "s0 is still pending when s1 fails");
        let err = results[0].as_ref().unwrap_err();
        let message = chain(err);
        assert!(matches!(err, SourceError::Tar { entry: Some(e), .. } if e == "s1.jpg"), "{message}");
        assert!(message.contains("huge.tar") && message.contains("declares 8589934591 bytes"), "{message}");

        // The same lie on a member that is no part of a sample: skipped, and still an error naming it.
        let mut bytes = shard(&[("s0.jpg", b"a"), ("README", b"b")]);
        bytes[at + 124..at + 136].copy_from_slice(b"77777777777\0");
        bytes[at + 148..at + 156].fill(b' ');
        let sum: u64 = bytes[at..at + BLOCK].iter().map(|&b| u64::from(b)).sum();
        bytes[at + 148..at + 156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let err = samples_of(&bytes, "skip.tar").into_iter().find_map(|r| r.err()).unwrap();
        assert!(matches!(&err, SourceError::Tar { entry: Some(e), .. } if e == "README"), "{err}");

        // A name that is not UTF-8.
        let mut header = tar::Header::new_gnu();
        header.as_mut_bytes()[..6].copy_from_slice(b"s\xff.jpg");
        header.set_size(1);
        header.set_cksum();
        let mut bytes = header.as_bytes().to_vec();
        bytes.push(b'x');
        bytes.resize(4 * BLOCK, 0);
        let err = samples_of(&bytes, "utf8.tar").into_iter().find_map(|r| r.err()).unwrap();
        let message = chain(&err);
        assert!(message.contains("not UTF-8") && message.contains("utf8.tar"), "{message}");

        // A GNU long name with no member after it.
        let long = format!("{}/s.jpg", "d".repeat(150));
        let bytes = shard(&[(&long, b"x")]);
        let err = samples_of(&bytes[..2 * BLOCK], "dangling.tar").into_iter().find_map(|r| r.err()).unwrap();
        assert!(matches!(tar_cause(&err), TarReadError::Format(TarFormatError::DanglingExtendedHeader)), "{err}");
    }

    /// A reader that fails after `ok` bytes.
    struct FailAfter<'a> {
        data: &'a [u8],
        ok: usize,
    }

    impl Read for FailAfter<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.ok == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "stalled"));
            }
            let n = buf.len().min(self.ok).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            self.ok -= n;
            Ok(n)
        }
    }

    #[test]
    fn reader_errors_keep_their_kind() {
        let bytes = shard(&[("s0.jpg", &[1; 2000]), ("s1.jpg", b"x")]);
        let reader = FailAfter { data: &bytes, ok: 1000 };
        let results: Vec<Result<WdsSample>> = ShardReader::new(reader, "stall.tar").samples().unwrap().collect();
        assert_eq!(results.len(), 1);
        let err = results[0].as_ref().unwrap_err();
        let SourceError::Tar { entry, source, .. } = err else { panic!("{err}") };
        assert_eq!(entry.as_deref(), Some("s0.jpg"));
        assert_eq!(source.kind(), std::io::ErrorKind::TimedOut);
        let message = chain(err);
        assert!(message.contains("stalled") && message.contains("stall.tar"), "{message}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn streams_shards_from_a_store() {
        let dir = tempfile::tempdir().unwrap();
        let mut expected = Vec::new();
        for s in 0..3 {
            let mut files: Vec<(String, Vec<u8>)> = Vec::new();
            for i in 0..50 {
                let key = format!("{s}-{i:03}");
                files.push((format!("{key}.bin"), vec![(s * 50 + i) as u8; 100 + i]));
                files.push((format!("{key}.cls"), i.to_string().into_bytes()));
                expected.push(key);
            }
            let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
            std::fs::write(dir.path().join(format!("shard-{s}.tar")), shard(&refs)).unwrap();
        }
        let store: Arc<dyn ObjectStore> = Arc::new(LocalStore::new(dir.path()).unwrap());
        let keys = vec!["shard-0.tar".to_string(), "missing.tar".into(), "shard-1.tar".into(), "shard-2.tar".into()];
        let results: Vec<Result<WdsSample>> = stream_shards(store.clone(), keys).collect().await;
        let errors: Vec<&SourceError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].is_not_found() && errors[0].to_string().contains("missing.tar"));
        let got: Vec<String> = results.into_iter().filter_map(|r| r.ok()).map(|s| s.key).collect();
        assert_eq!(got, expected);

        // Dropping the stream early stops the producer without hanging.
        let mut stream = stream_shards(store, vec!["shard-0.tar".into(); 100]);
        let first = stream.try_next().await.unwrap().unwrap();
        assert_eq!(first.key, "0-000");
        drop(stream);
    }
}
