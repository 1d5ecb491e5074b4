//! Where media comes from, for every medium: a file path, or bytes already in memory (fetched from S3, a
//! tar shard, HTTP).

use std::borrow::Cow;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// A media input: a path (read with seeks, so a time window does not read the whole file) or in-memory
/// bytes with a name for errors. Audio, video and [`crate::probe`] accept both.
///
/// ```
/// use spdl_io::MediaInput;
/// use std::path::Path;
///
/// let from_file = MediaInput::from(Path::new("clip.wav"));
/// assert_eq!(from_file.name(), "clip.wav");
/// let data = vec![0u8; 4];
/// let from_memory = MediaInput::bytes(&data, "s3://bucket/clip.flac");
/// assert_eq!(from_memory.extension(), Some("flac"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaInput<'a> {
    /// A file on disk.
    Path(&'a Path),
    /// Encoded bytes in memory.
    Bytes {
        /// The encoded bytes.
        data: &'a [u8],
        /// A name for errors (a key, a URL); its extension, if any, is a format hint.
        name: &'a str,
    },
}

impl<'a> MediaInput<'a> {
    /// In-memory bytes with a name for errors.
    pub fn bytes(data: &'a [u8], name: &'a str) -> MediaInput<'a> {
        MediaInput::Bytes { data, name }
    }

    /// The name used in errors: the path, or the given name.
    pub fn name(&self) -> Cow<'a, str> {
        match *self {
            MediaInput::Path(p) => p.to_string_lossy(),
            MediaInput::Bytes { name, .. } => Cow::Borrowed(name),
        }
    }

    /// The file extension of the path or name, lowercase not guaranteed (a format hint only).
    pub fn extension(&self) -> Option<&'a str> {
        match *self {
            MediaInput::Path(p) => p.extension().and_then(|e| e.to_str()),
            MediaInput::Bytes { name, .. } => {
                let file = name.rsplit(['/', '\\']).next().unwrap_or(name);
                file.rsplit_once('.').map(|(_, ext)| ext).filter(|e| !e.is_empty())
            }
        }
    }

    /// Opens a path for windowed reads: it must be a regular file (a FIFO, device or socket could block or
    /// never end; read such a file with [`crate::read_file`] and an opt-in, and pass its bytes).
    #[cfg_attr(not(feature = "audio"), allow(dead_code))] // audio, video and probe read windows
    pub(crate) fn open_file(path: &Path) -> Result<File> {
        super::read::open_checked(path, &crate::ReadLimits::default(), false).map(|(f, _)| f)
    }

    /// Total size in bytes (a path must be a regular file).
    #[cfg_attr(not(feature = "audio"), allow(dead_code))] // audio, video and probe read windows
    pub(crate) fn len(&self) -> Result<u64> {
        match *self {
            MediaInput::Path(p) => {
                let meta = std::fs::metadata(p).map_err(|source| Error::Io { path: p.to_owned(), source })?;
                if !meta.is_file() {
                    // Let the check say what the path is.
                    Self::open_file(p)?;
                }
                Ok(meta.len())
            }
            MediaInput::Bytes { data, .. } => Ok(data.len() as u64),
        }
    }

    /// Fails with [`Error::Empty`] on a zero-length input.
    #[cfg_attr(not(feature = "audio"), allow(dead_code))] // audio, video and probe read windows
    pub(crate) fn check_not_empty(&self) -> Result<()> {
        if self.len()? == 0 {
            return Err(Error::Empty { item: self.name().into_owned() });
        }
        Ok(())
    }

    /// Up to `len` bytes at `offset` (fewer at the end of the input): borrowed for in-memory bytes, one
    /// positioned read for a file.
    #[cfg_attr(not(feature = "audio"), allow(dead_code))] // audio, video and probe read windows
    pub(crate) fn read_at(&self, file: Option<&mut File>, offset: u64, len: usize) -> Result<Cow<'a, [u8]>> {
        match (*self, file) {
            (MediaInput::Bytes { data, .. }, _) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
                let end = start.saturating_add(len).min(data.len());
                Ok(Cow::Borrowed(data.get(start..end).unwrap_or_default()))
            }
            (MediaInput::Path(p), Some(f)) => {
                let io = |source| Error::Io { path: p.to_owned(), source };
                f.seek(SeekFrom::Start(offset)).map_err(io)?;
                let mut buf = Vec::with_capacity(len.min(1 << 30));
                f.take(len as u64).read_to_end(&mut buf).map_err(io)?;
                Ok(Cow::Owned(buf))
            }
            (MediaInput::Path(p), None) => {
                let mut f = Self::open_file(p)?;
                self.read_at(Some(&mut f), offset, len).map(|c| Cow::Owned(c.into_owned()))
            }
        }
    }
}

impl<'a> From<&'a Path> for MediaInput<'a> {
    fn from(p: &'a Path) -> Self {
        MediaInput::Path(p)
    }
}

impl<'a> From<&'a PathBuf> for MediaInput<'a> {
    fn from(p: &'a PathBuf) -> Self {
        MediaInput::Path(p.as_path())
    }
}

impl<'a> From<&'a [u8]> for MediaInput<'a> {
    /// Bytes named `"<bytes>"` in errors; use [`MediaInput::bytes`] to give a name.
    fn from(data: &'a [u8]) -> Self {
        MediaInput::Bytes { data, name: "<bytes>" }
    }
}

impl<'a> From<&'a Vec<u8>> for MediaInput<'a> {
    fn from(data: &'a Vec<u8>) -> Self {
        MediaInput::Bytes { data, name: "<bytes>" }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extension_and_name() {
        assert_eq!(MediaInput::bytes(b"", "a/b.c/d").extension(), None);
        assert_eq!(MediaInput::bytes(b"", "x.").extension(), None);
        assert_eq!(MediaInput::bytes(b"", "s3://b/k.MP3").extension(), Some("MP3"));
        assert_eq!(MediaInput::from(Path::new("/t/a.wav")).name(), "/t/a.wav");
    }

    #[test]
    fn read_at_clamps() {
        let data = [1u8, 2, 3, 4];
        let m = MediaInput::bytes(&data, "m");
        assert_eq!(&*m.read_at(None, 2, 10).unwrap(), &[3, 4]);
        assert!(m.read_at(None, 10, 10).unwrap().is_empty());
        assert!(matches!(MediaInput::bytes(b"", "e").check_not_empty(), Err(Error::Empty { .. })));
    }
}
