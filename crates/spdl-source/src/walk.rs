//! A lazy, deterministic directory walk that yields keys in lexicographic byte order, as S3 lists them.
//!
//! Sorting each directory's entries by name, with `/` appended to directory names, and walking depth first gives
//! the global byte order of the full keys: every key under `a/` starts with `a/`, so `a.txt` (`.` < `/`) comes
//! before it and `a0` (`0` > `/`) after it, exactly where the flat sort would put them.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

use crate::error::{Result, SourceError};

/// One pending item of the walk.
#[derive(Debug)]
enum Pending {
    File { key: String, size: u64 },
    Dir { path: PathBuf, key: String },
    Error(SourceError),
}

/// Walks `root`, yielding `(key, size)` of every regular file whose key starts with `prefix`.
///
/// Real directories are always walked under their own names. A symbolic link to a directory inside the root is
/// skipped: what it points to is listed once, under its real path, so a link can never take a folder's place (nor
/// its class). A link to a directory outside the root is walked under the link's name unless the walk is
/// confined, each outside directory at most once (so link loops and diamonds end). Links to files are listed under
/// the link's name, unless the walk is confined and the file is outside the root. Dangling links and special
/// files (FIFOs, devices, sockets) are skipped; any other error is yielded.
#[derive(Debug)]
pub(crate) struct Walker {
    prefix: String,
    stack: Vec<Pending>,
    seen_dirs: HashSet<PathBuf>,
    /// The root, resolved; `None` when it cannot be resolved (then no link counts as inside).
    canonical_root: Option<PathBuf>,
    /// Refuse links that resolve outside the root.
    confined: bool,
}

impl Walker {
    /// Starts a walk of `root` restricted to keys starting with `prefix`, following links out of the root.
    pub(crate) fn new(root: &Path, prefix: &str) -> Result<Walker> {
        Self::with_confinement(root, prefix, false)
    }

    /// As [`new`](Self::new); with `confined`, nothing outside the root is listed.
    pub(crate) fn with_confinement(root: &Path, prefix: &str, confined: bool) -> Result<Walker> {
        check_relative(prefix, true)?;
        // Start from the deepest directory the prefix names in full; the rest of the prefix filters names there.
        let dir_part = prefix.rfind('/').map(|i| &prefix[..=i]).unwrap_or("");
        let start = if dir_part.is_empty() { root.to_path_buf() } else { root.join(dir_part) };
        let mut walker = Walker {
            prefix: prefix.to_owned(),
            stack: Vec::new(),
            seen_dirs: HashSet::new(),
            canonical_root: std::fs::canonicalize(root).ok(),
            confined,
        };
        match std::fs::metadata(&start) {
            Ok(meta) if meta.is_dir() => {
                let escapes = confined
                    && !dir_part.is_empty()
                    && !std::fs::canonicalize(&start).is_ok_and(|c| walker.is_inside(&c));
                if !escapes {
                    walker.stack.push(Pending::Dir { path: start, key: dir_part.to_owned() });
                }
            }
            // The root must be a directory: a file or a device there is a mistake, not an empty listing.
            Ok(_) if dir_part.is_empty() => {
                let source = std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory");
                return Err(SourceError::Io { operation: "list", path: start, source });
            }
            Ok(_) => {}
            // A prefix naming no directory lists nothing, as in S3; a missing root is an error.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !dir_part.is_empty() => {}
            Err(e) => return Err(SourceError::io("list", &start, e)),
        }
        Ok(walker)
    }

    /// True when `canonical` is the root or under it.
    fn is_inside(&self, canonical: &Path) -> bool {
        self.canonical_root.as_deref().is_some_and(|root| canonical.starts_with(root))
    }

    /// Reads one directory and pushes its entries, largest name first so that the smallest pops first.
    fn expand(&mut self, path: PathBuf, key: String) {
        if let Ok(canonical) = std::fs::canonicalize(&path)
            && !self.seen_dirs.insert(canonical)
        {
            return;
        }
        let entries = match std::fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) => {
                self.stack.push(Pending::Error(SourceError::io("list", &path, e)));
                return;
            }
        };
        let mut children: Vec<(String, Pending)> = Vec::new();
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    children.push((String::new(), Pending::Error(SourceError::io("list", &path, e))));
                    continue;
                }
            };
            let child_path = entry.path();
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                let err = SourceError::InvalidKey {
                    key: child_path.display().to_string(),
                    reason: "file name is not valid UTF-8",
                };
                children.push((String::new(), Pending::Error(err)));
                continue;
            };
            let meta = match self.classify(&entry, &child_path) {
                Ok(Some(meta)) => meta,
                Ok(None) => continue,
                Err(err) => {
                    children.push((String::new(), Pending::Error(err)));
                    continue;
                }
            };
            let child_key = format!("{key}{name}");
            if meta.is_dir() {
                let dir_key = format!("{child_key}/");
                if dir_key.starts_with(&self.prefix) || self.prefix.starts_with(&dir_key) {
                    children.push((dir_key.clone(), Pending::Dir { path: child_path, key: dir_key }));
                }
            } else if meta.is_file() && child_key.starts_with(&self.prefix) {
                children.push((child_key.clone(), Pending::File { key: child_key, size: meta.len() }));
            }
        }
        children.sort_by(|a, b| b.0.cmp(&a.0));
        self.stack.extend(children.into_iter().map(|(_, pending)| pending));
    }

    /// The metadata to list an entry by, or `None` to skip it (see [`Walker`] for the rules on links).
    fn classify(&self, entry: &std::fs::DirEntry, path: &Path) -> Result<Option<std::fs::Metadata>> {
        let skip_missing = |e: std::io::Error| match e.kind() {
            // Dangling links, link loops and entries removed while listing are not objects.
            std::io::ErrorKind::NotFound => Ok(None),
            _ if is_link_loop(&e) => Ok(None),
            _ => Err(SourceError::io("list", path, e)),
        };
        let is_link = match entry.file_type() {
            Ok(t) => t.is_symlink(),
            Err(e) => return skip_missing(e),
        };
        if !is_link {
            return entry.metadata().map(Some).or_else(skip_missing);
        }
        let meta = match std::fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) => return skip_missing(e),
        };
        let target = match std::fs::canonicalize(path) {
            Ok(target) => target,
            Err(e) => return skip_missing(e),
        };
        let inside = self.is_inside(&target);
        if meta.is_dir() && inside {
            // Listed under its real path; a link must not stand in for a real folder (or loop back up).
            return Ok(None);
        }
        if !inside && self.confined {
            return Ok(None);
        }
        Ok(Some(meta))
    }
}

/// True for `ELOOP` (too many levels of symbolic links).
fn is_link_loop(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        e.raw_os_error() == Some(libc::ELOOP)
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

impl Iterator for Walker {
    type Item = Result<(String, u64)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.stack.pop()? {
                Pending::File { key, size } => return Some(Ok((key, size))),
                Pending::Error(err) => return Some(Err(err)),
                Pending::Dir { path, key } => self.expand(path, key),
            }
        }
    }
}

/// Checks that `key` is a relative `/`-separated path without `..`, so it cannot escape the store's root.
pub(crate) fn check_relative(key: &str, allow_empty: bool) -> Result<()> {
    let invalid = |reason| Err(SourceError::InvalidKey { key: key.to_owned(), reason });
    if key.is_empty() {
        return if allow_empty { Ok(()) } else { invalid("empty key") };
    }
    if key.starts_with('/') || key.contains('\\') || key.contains('\0') {
        return invalid("keys are relative `/`-separated paths");
    }
    if Path::new(key).components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir)) {
        return invalid("`..` and absolute components are not allowed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(root: &Path, rel: &str, len: usize) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, vec![0u8; len]).unwrap();
    }

    fn keys(root: &Path, prefix: &str) -> Vec<String> {
        Walker::new(root, prefix).unwrap().map(|r| r.unwrap().0).collect()
    }

    #[test]
    fn walks_in_byte_order_like_s3() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["a.txt", "a/b", "a/c/d", "a0", "b", "B", "a/b.x", "z/y/x/w"];
        for (i, n) in names.iter().enumerate() {
            touch(dir.path(), n, i);
        }
        let mut expected: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        expected.sort();
        assert_eq!(keys(dir.path(), ""), expected);
        let sizes: Vec<u64> = Walker::new(dir.path(), "a.").unwrap().map(|r| r.unwrap().1).collect();
        assert_eq!(sizes, vec![0]);
    }

    #[test]
    fn prefix_filters_like_s3() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["train/cat/1.jpg", "train/cat/2.jpg", "train/catfish/1.jpg", "train/dog/1.jpg", "val/cat/1.jpg"] {
            touch(dir.path(), n, 1);
        }
        assert_eq!(keys(dir.path(), "train/cat"), ["train/cat/1.jpg", "train/cat/2.jpg", "train/catfish/1.jpg"]);
        assert_eq!(keys(dir.path(), "train/cat/"), ["train/cat/1.jpg", "train/cat/2.jpg"]);
        assert_eq!(
            keys(dir.path(), "tr"),
            ["train/cat/1.jpg", "train/cat/2.jpg", "train/catfish/1.jpg", "train/dog/1.jpg"]
        );
        assert!(keys(dir.path(), "nothing/here/").is_empty());
        assert!(Walker::new(dir.path(), "../etc").is_err());
    }

    #[cfg(unix)]
    #[test]
    fn follows_links_without_looping() {
        let dir = tempfile::tempdir().unwrap();
        touch(dir.path(), "real/x", 3);
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("real/loop")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("real/x"), dir.path().join("y")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("missing"), dir.path().join("dangling")).unwrap();
        assert_eq!(keys(dir.path(), ""), ["real/x", "y"]);
    }

    #[test]
    fn rejects_escaping_keys() {
        for bad in ["", "/etc/passwd", "a/../../b", "..", "a\\b"] {
            assert!(check_relative(bad, false).is_err(), "{bad}");
        }
        for good in ["a", "a/b.jpg", "./a", "a b/c"] {
            assert!(check_relative(good, false).is_ok(), "{good}");
        }
    }
}
