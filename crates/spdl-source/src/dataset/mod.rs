//! Datasets: the list of `(key, label)` records a training loop indexes into, built from a directory walk, the
//! ImageNet class-folder layout, a manifest file, or any [`ObjectStore`] listing; plus WebDataset tar shards.
//!
//! Listings are sorted by key and therefore deterministic: every rank of a distributed job, on every machine,
//! sees the same index for the same record, which is what samplers rely on.
//!
//! ```
//! use spdl_source::Dataset;
//!
//! let root = tempfile::tempdir()?;
//! for (class, file) in [("dog", "1.jpg"), ("cat", "2.JPG"), ("cat", "1.jpg"), ("cat", "notes.txt")] {
//!     std::fs::create_dir_all(root.path().join(class))?;
//!     std::fs::write(root.path().join(class).join(file), b"...")?;
//! }
//! let ds = Dataset::image_folder(root.path(), &["jpg", "jpeg"])?;
//! assert_eq!(ds.classes(), ["cat", "dog"]);
//! let records: Vec<(&str, Option<i64>)> = ds.iter().map(|r| (r.key.as_str(), r.label)).collect();
//! assert_eq!(records, [("cat/1.jpg", Some(0)), ("cat/2.JPG", Some(0)), ("dog/1.jpg", Some(1))]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`ObjectStore`]: crate::ObjectStore

use std::collections::BTreeSet;
use std::path::Path;

use futures::TryStreamExt;

use crate::error::Result;
use crate::store::ObjectStore;
use crate::walk::Walker;

mod manifest;
mod wds;

pub use manifest::ManifestFormat;
pub use wds::{ShardReader, WdsSample, WdsSamples, stream_shards};

/// One item of a dataset: the key to fetch (relative to the store or directory it was listed from) and an optional
/// integer label.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Record {
    /// The object's key.
    pub key: String,
    /// The class index or target, when the listing has one.
    pub label: Option<i64>,
}

impl Record {
    /// A record.
    pub fn new(key: impl Into<String>, label: Option<i64>) -> Self {
        Record { key: key.into(), label }
    }
}

/// How labels are derived from keys in a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FolderLayout {
    /// Every matching file, no labels.
    #[default]
    Flat,
    /// ImageNet / torchvision `ImageFolder`: the first folder under the root is the class; classes are sorted by
    /// name and numbered from 0. Files directly under the root have no class and are skipped.
    ClassFolders,
    /// [`ClassFolders`](Self::ClassFolders) when at least one matching file sits in a folder under the root,
    /// else [`Flat`](Self::Flat): decided on the one listing, so a store is listed once.
    Auto,
}

/// An indexed list of records, with class names when the labels came from names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dataset {
    records: Vec<Record>,
    classes: Vec<String>,
}

impl Dataset {
    /// A dataset from records and (possibly empty) class names; `label` `i` names `classes[i]`.
    pub fn new(records: Vec<Record>, classes: Vec<String>) -> Self {
        Dataset { records, classes }
    }

    /// Every file under `root` whose extension is in `extensions` (case-insensitive, without the dot; empty means
    /// every file), sorted by key; keys are `/`-separated paths relative to `root`; no labels.
    pub fn from_dir(root: impl AsRef<Path>, extensions: &[&str]) -> Result<Self> {
        Self::from_dir_with_layout(root, extensions, FolderLayout::Flat)
    }

    /// The ImageNet layout (`root/<class>/**/<file>`): labels are the index of the class folder among the sorted
    /// class names. See [`FolderLayout::ClassFolders`].
    pub fn image_folder(root: impl AsRef<Path>, extensions: &[&str]) -> Result<Self> {
        Self::from_dir_with_layout(root, extensions, FolderLayout::ClassFolders)
    }

    /// Every file under `root` whose extension is in `extensions`, labelled as `layout` says (see
    /// [`from_dir`](Self::from_dir) for the keys).
    pub fn from_dir_with_layout(root: impl AsRef<Path>, extensions: &[&str], layout: FolderLayout) -> Result<Self> {
        let mut keys = Vec::new();
        for item in Walker::new(root.as_ref(), "")? {
            let (key, _) = item?;
            keys.push(key);
        }
        Ok(Self::from_keys(keys, "", extensions, layout))
    }

    /// Lists `prefix` in any store (an S3 bucket, a local directory...) the same way as [`Dataset::from_dir`] or
    /// [`Dataset::image_folder`] do on a directory. Keys stay full store keys (prefix included), ready for `get`;
    /// with [`FolderLayout::ClassFolders`] the class is the first folder below `prefix`.
    pub async fn from_store(
        store: &dyn ObjectStore,
        prefix: &str,
        extensions: &[&str],
        layout: FolderLayout,
    ) -> Result<Self> {
        let prefix = if prefix.is_empty() || prefix.ends_with('/') { prefix.to_owned() } else { format!("{prefix}/") };
        let keys: Vec<String> = store.list(&prefix).map_ok(|meta| meta.key).try_collect().await?;
        Ok(Self::from_keys(keys, &prefix, extensions, layout))
    }

    /// Builds a dataset from listed keys: filter by extension, sort, derive labels.
    fn from_keys(mut keys: Vec<String>, prefix: &str, extensions: &[&str], layout: FolderLayout) -> Self {
        let wanted: Vec<String> = extensions.iter().map(|e| e.trim_start_matches('.').to_ascii_lowercase()).collect();
        keys.retain(|key| wanted.is_empty() || has_extension(key, &wanted));
        keys.sort_unstable();
        keys.dedup();
        let class_of = |key: &str| -> Option<String> {
            let rel = key.strip_prefix(prefix)?;
            let (class, _) = rel.split_once('/')?;
            (!class.is_empty()).then(|| class.to_owned())
        };
        let by_class = match layout {
            FolderLayout::Flat => false,
            FolderLayout::ClassFolders => true,
            FolderLayout::Auto => keys.iter().any(|k| class_of(k).is_some()),
        };
        if !by_class {
            return Dataset::new(keys.into_iter().map(|k| Record::new(k, None)).collect(), Vec::new());
        }
        let classes: Vec<String> =
            keys.iter().filter_map(|k| class_of(k)).collect::<BTreeSet<_>>().into_iter().collect();
        let records = keys
            .into_iter()
            .filter_map(|key| {
                let class = class_of(&key)?;
                let label = classes.binary_search(&class).ok()?;
                Some(Record::new(key, Some(label as i64)))
            })
            .collect();
        Dataset::new(records, classes)
    }

    /// Reads a manifest file; the format is chosen by extension (`.csv`, `.tsv`, anything else is one key per
    /// line). See [`ManifestFormat`]. The file must be a regular file of at most
    /// [`DEFAULT_MAX_OBJECT_SIZE`](crate::DEFAULT_MAX_OBJECT_SIZE) bytes (checked from its metadata before it is
    /// read): a FIFO or a device such as `/dev/zero` is refused rather than read without end.
    pub fn from_manifest(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io_err = |op, e| crate::SourceError::io(op, path, e);
        let meta = std::fs::metadata(path).map_err(|e| io_err("stat", e))?;
        if !meta.is_file() && !meta.is_dir() {
            let kind = crate::store::local::special_kind(&meta);
            return Err(crate::SourceError::NotRegularFile { location: path.display().to_string(), kind });
        }
        let limit = crate::DEFAULT_MAX_OBJECT_SIZE;
        let too_large = |size| crate::SourceError::ObjectTooLarge {
            location: path.display().to_string(),
            size,
            limit,
            hint: " (a manifest this large is not supported)",
        };
        if meta.len() > limit {
            return Err(too_large(Some(meta.len())));
        }
        // A directory fails here with its own error; a file that grew after the stat is refused past the limit.
        let file = std::fs::File::open(path).map_err(|e| io_err("open", e))?;
        let bound = spdl_buffer::file::BoundedRead::new(limit).size_hint(meta.len());
        let bytes = spdl_buffer::file::read_bounded(file, &bound).map_err(|e| match e {
            spdl_buffer::file::ReadBoundError::TooLarge { .. } => too_large(None),
            spdl_buffer::file::ReadBoundError::Io(e) => io_err("read", e),
            other => io_err("read", std::io::Error::new(std::io::ErrorKind::OutOfMemory, other)),
        })?;
        let text = String::from_utf8(bytes).map_err(|_| {
            io_err("read", std::io::Error::new(std::io::ErrorKind::InvalidData, "stream did not contain valid UTF-8"))
        })?;
        let name = path.display().to_string();
        Self::parse_manifest(&text, &name, ManifestFormat::from_name(&name))
    }

    /// Parses manifest text (e.g. fetched from a store); `name` appears in errors.
    pub fn parse_manifest(text: &str, name: &str, format: ManifestFormat) -> Result<Self> {
        manifest::parse(text, name, &format)
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when there are no records.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The record at `index`.
    pub fn get(&self, index: usize) -> Option<&Record> {
        self.records.get(index)
    }

    /// All records, in index order.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Class names, when labels came from names (class folders or a manifest with textual labels).
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Iterates over the records in index order.
    pub fn iter(&self) -> std::slice::Iter<'_, Record> {
        self.records.iter()
    }

    /// The records at `indices` (e.g. a sampler's order), skipping indices past the end.
    pub fn select<'a>(
        &'a self,
        indices: impl IntoIterator<Item = usize> + 'a,
    ) -> impl Iterator<Item = &'a Record> + 'a {
        indices.into_iter().filter_map(|i| self.records.get(i))
    }

    /// The records, by value.
    pub fn into_records(self) -> Vec<Record> {
        self.records
    }
}

impl<'a> IntoIterator for &'a Dataset {
    type Item = &'a Record;
    type IntoIter = std::slice::Iter<'a, Record>;
    fn into_iter(self) -> Self::IntoIter {
        self.records.iter()
    }
}

/// True when the part of the last path component after its last dot is one of `wanted` (lowercase).
fn has_extension(key: &str, wanted: &[String]) -> bool {
    let name = key.rsplit('/').next().unwrap_or(key);
    match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => wanted.iter().any(|w| w.eq_ignore_ascii_case(ext)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalStore;

    fn make(root: &Path, files: &[&str]) {
        for f in files {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, f.as_bytes()).unwrap();
        }
    }

    #[test]
    fn dir_walk_filters_and_sorts() {
        let dir = tempfile::tempdir().unwrap();
        make(dir.path(), &["b/2.png", "a/1.JPEG", "a/x.txt", ".jpg", "c/d/e.jpg", "noext"]);
        let ds = Dataset::from_dir(dir.path(), &["jpg", ".jpeg", "PNG"]).unwrap();
        let keys: Vec<&str> = ds.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["a/1.JPEG", "b/2.png", "c/d/e.jpg"]);
        assert!(ds.iter().all(|r| r.label.is_none()));
        assert_eq!(Dataset::from_dir(dir.path(), &[]).unwrap().len(), 6);
        assert!(Dataset::from_dir(dir.path().join("missing"), &[]).unwrap_err().is_not_found());
    }

    #[test]
    fn image_folder_numbers_sorted_classes() {
        let dir = tempfile::tempdir().unwrap();
        make(dir.path(), &["n02/b.jpg", "n01/a.jpg", "n01/sub/c.jpg", "n03/readme.txt", "top.jpg"]);
        let ds = Dataset::image_folder(dir.path(), &["jpg"]).unwrap();
        assert_eq!(ds.classes(), ["n01", "n02"]);
        let got: Vec<(String, Option<i64>)> = ds.iter().map(|r| (r.key.clone(), r.label)).collect();
        assert_eq!(
            got,
            [("n01/a.jpg".into(), Some(0)), ("n01/sub/c.jpg".into(), Some(0)), ("n02/b.jpg".into(), Some(1))]
        );
        let picked: Vec<&str> = ds.select([2, 0, 9]).map(|r| r.key.as_str()).collect();
        assert_eq!(picked, ["n02/b.jpg", "n01/a.jpg"]);
    }

    #[test]
    fn auto_layout_uses_class_folders_only_when_there_are_some() {
        let dir = tempfile::tempdir().unwrap();
        make(dir.path(), &["n01/a.jpg", "top.jpg", "n02/readme.txt"]);
        let auto = Dataset::from_dir_with_layout(dir.path(), &["jpg"], FolderLayout::Auto).unwrap();
        assert_eq!(auto, Dataset::image_folder(dir.path(), &["jpg"]).unwrap());
        let flat_dir = tempfile::tempdir().unwrap();
        make(flat_dir.path(), &["b.jpg", "a.jpg", "sub.txt/x.txt"]);
        let auto = Dataset::from_dir_with_layout(flat_dir.path(), &["jpg"], FolderLayout::Auto).unwrap();
        assert_eq!(auto, Dataset::from_dir(flat_dir.path(), &["jpg"]).unwrap());
        assert_eq!(auto.len(), 2);
    }

    #[tokio::test]
    async fn store_listing_matches_dir_walk() {
        let dir = tempfile::tempdir().unwrap();
        make(dir.path(), &["train/n02/b.jpg", "train/n01/a.jpg", "train/n01/z.txt", "val/n01/c.jpg"]);
        let store = LocalStore::new(dir.path()).unwrap();
        let ds = Dataset::from_store(&store, "train", &["jpg"], FolderLayout::ClassFolders).await.unwrap();
        assert_eq!(ds.classes(), ["n01", "n02"]);
        let got: Vec<(&str, Option<i64>)> = ds.iter().map(|r| (r.key.as_str(), r.label)).collect();
        assert_eq!(got, [("train/n01/a.jpg", Some(0)), ("train/n02/b.jpg", Some(1))]);
        let local = Dataset::image_folder(dir.path().join("train"), &["jpg"]).unwrap();
        assert_eq!(local.classes(), ds.classes());
        let flat = Dataset::from_store(&store, "", &[], FolderLayout::Flat).await.unwrap();
        assert_eq!(flat.len(), 4);
    }
}
