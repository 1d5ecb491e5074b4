//! WebDataset tar shards: files grouped into samples by basename, read straight from the tar stream.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};

use crate::error::{Result, SourceError};
use crate::store::ObjectStore;

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
    archive: tar::Archive<R>,
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
        ShardReader { archive: tar::Archive::new(reader), name: name.into() }
    }

    /// Iterates over the shard's samples, in the order of the tar.
    pub fn samples(&mut self) -> Result<WdsSamples<'_, R>> {
        let entries = self.archive.entries().map_err(|e| tar_error(&self.name, None, e))?;
        Ok(WdsSamples { entries, shard: self.name.clone(), pending: None, done: false })
    }
}

/// The samples of a shard; see [`ShardReader::samples`].
pub struct WdsSamples<'a, R: Read> {
    entries: tar::Entries<'a, R>,
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
}

impl<R: Read> Iterator for WdsSamples<'_, R> {
    type Item = Result<WdsSample>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        loop {
            let mut entry = match self.entries.next() {
                None => {
                    self.done = true;
                    return self.pending.take().map(Ok);
                }
                Some(Err(e)) => return self.fail(None, e),
                Some(Ok(entry)) => entry,
            };
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let path = match entry.path() {
                Ok(p) => match p.to_str() {
                    Some(p) => p.to_owned(),
                    None => {
                        let err = std::io::Error::new(std::io::ErrorKind::InvalidData, "member name is not UTF-8");
                        return self.fail(Some(p.display().to_string()), err);
                    }
                },
                Err(e) => return self.fail(None, e),
            };
            let Some((key, ext)) = split_name(&path) else { continue };
            // The header's size is untrusted: preallocate at most 16 MiB and let larger members grow.
            let mut data = Vec::with_capacity(usize::try_from(entry.size()).unwrap_or(0).min(16 << 20));
            if let Err(e) = entry.read_to_end(&mut data) {
                return self.fail(Some(path), e);
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
