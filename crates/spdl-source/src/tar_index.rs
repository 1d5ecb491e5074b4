//! A TAR member index over bytes in memory: where each regular file's data lies, without copying it.
//!
//! [`index`] scans a whole archive held in memory and returns, for each regular member, its path and the
//! `(offset, size)` of its data in the buffer, so a caller can hand out slices of the buffer itself. It reads the
//! POSIX ustar layout (with the `prefix` field), GNU long names and long link names (`././@LongLink`), PAX
//! extended headers (local `x` and global `g`; the `path` and `size` records are used) and GNU base-256 sizes.
//! Regular members are the types `'0'`, NUL (pre-POSIX) and `'7'` (contiguous file); directories, links, devices
//! and FIFOs are skipped, and so are the data blocks of any other type (e.g. GNU sparse `'S'`).
//!
//! [`TarReader`] reads the same members from any [`std::io::Read`] (a file, a pipe, a WebDataset shard being
//! fetched), in order and without seeking: it yields each regular member's path and size, and reads its data on
//! request or skips it. The WebDataset reader ([`crate::dataset::ShardReader`]) is built on it.
//!
//! [`TarParser`] is the header logic on its own, shared by both and by readers that get their blocks some other
//! way: it is fed one 512-byte header at a time and the metadata blocks it asks for, and says what each header
//! describes.
//!
//! Hostile archives are safe to scan: every declared size is checked against the bytes that are there before
//! anything is sliced, nothing of a declared size is allocated (metadata is bounded by [`MAX_META_BYTES`]; a
//! streamed member's buffer grows as its bytes arrive), and each failure is a [`TarFormatError`] that names the
//! offset and the cause (or, streaming, a [`TarReadError`] that also carries the reader's own failures).

use std::fmt::Write as _;

/// The size of a TAR block: headers take one, member data is padded to a multiple of it.
pub const BLOCK: usize = 512;

/// The most bytes of metadata (a GNU long name or link name, a PAX header) one header may declare.
pub const MAX_META_BYTES: u64 = 1 << 20;

/// A malformed or truncated archive. The message names the offset (and the member, where there is one) and
/// the cause, in the words of `spdl_rs.io.iter_tarfile`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TarFormatError {
    /// The data ends inside a header block.
    #[error("TAR archive is truncated: {remaining} bytes at offset {offset}, a header needs 512")]
    TruncatedHeader {
        /// Where the header starts.
        offset: u64,
        /// The bytes left there.
        remaining: u64,
    },
    /// A member's (or a metadata block's) declared size runs past the end of the data.
    #[error("TAR archive is truncated: member {} declares {size} bytes, {remaining} remain (offset {offset})", py_repr(.member.as_bytes()))]
    TruncatedData {
        /// The member's path, or the kind of metadata (`"GNU long name"`, `"PAX header"`, ...).
        member: String,
        /// The declared size.
        size: u64,
        /// The bytes left.
        remaining: u64,
        /// Where the data starts.
        offset: u64,
    },
    /// A GNU long name or PAX header comes last, with no member header after it.
    #[error("TAR archive is truncated: an extended header has no member after it")]
    DanglingExtendedHeader,
    /// The header's checksum does not match its bytes (the data is not a TAR archive, or is damaged).
    #[error("TAR header at offset {offset} has a bad checksum (not a TAR archive?)")]
    BadChecksum {
        /// Where the header starts.
        offset: u64,
    },
    /// A numeric field that is neither octal nor base-256, or a base-256 value too large for 64 bits.
    #[error("TAR header at offset {offset}: invalid {field} field {}", py_bytes_repr(.raw))]
    InvalidNumber {
        /// Where the header starts.
        offset: u64,
        /// The field (`"size"`).
        field: &'static str,
        /// The field's raw bytes.
        raw: Vec<u8>,
    },
    /// A base-256 field with the sign byte set.
    #[error("TAR header at offset {offset}: negative {field}")]
    NegativeNumber {
        /// Where the header starts.
        offset: u64,
        /// The field (`"size"`).
        field: &'static str,
    },
    /// A metadata header declares more than [`MAX_META_BYTES`].
    #[error("TAR {kind} at offset {offset} declares {size} bytes (more than {MAX_META_BYTES})")]
    MetadataTooLarge {
        /// What the metadata is (`"GNU long name"`, `"PAX header"`, ...).
        kind: &'static str,
        /// Where its header starts.
        offset: u64,
        /// The declared size.
        size: u64,
    },
    /// A PAX record that cannot be read.
    #[error("TAR PAX header at offset {offset}: {cause}")]
    InvalidPaxRecord {
        /// Where the PAX header starts.
        offset: u64,
        /// What is wrong with the record.
        cause: String,
    },
    /// A PAX `size` record that is not a non-negative integer.
    #[error("TAR PAX header before offset {offset}: {}", if *.negative { "negative size".to_owned() } else { format!("invalid size {}", py_bytes_repr(.value)) })]
    InvalidPaxSize {
        /// Where the member's own header starts.
        offset: u64,
        /// The record's value.
        value: Vec<u8>,
        /// Whether it is a negative integer (otherwise it is not an integer, or too large).
        negative: bool,
    },
}

/// The kinds of metadata a header may announce: their data is read, given to [`TarParser::metadata`], and
/// applies to the next member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaKind {
    /// GNU `L`: the next member's path.
    GnuLongName,
    /// GNU `K`: the next member's link target (read and dropped).
    GnuLongLink,
    /// PAX `x`: records for the next member.
    Pax,
    /// PAX `g`: records for every later member.
    PaxGlobal,
}

impl MetaKind {
    /// The words errors use for it.
    pub fn describe(self) -> &'static str {
        match self {
            MetaKind::GnuLongName => "GNU long name",
            MetaKind::GnuLongLink => "GNU long link name",
            MetaKind::Pax => "PAX header",
            MetaKind::PaxGlobal => "PAX global header",
        }
    }
}

/// What follows a member header in the archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberData {
    /// A regular file: its `size` bytes of data follow.
    Regular,
    /// A member of another type that stores data blocks (e.g. GNU sparse): skip `size` bytes.
    Skipped,
    /// A link, device, directory or FIFO: no data blocks, whatever the size field says.
    NoData,
}

/// What a header block describes, as [`TarParser::header`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderStep {
    /// Metadata of `size` bytes (at most [`MAX_META_BYTES`]) follows, padded to a block: pass it to
    /// [`TarParser::metadata`].
    Meta {
        /// What it is.
        kind: MetaKind,
        /// Its declared size.
        size: u64,
    },
    /// A member, its path resolved (PAX `path`, GNU long name or ustar prefix + name) and its size (PAX `size`
    /// or the header's).
    Member {
        /// The path, as stored (usually UTF-8).
        name: Vec<u8>,
        /// The size of its data.
        size: u64,
        /// Whether its data is there, and whether it is a regular file.
        data: MemberData,
    },
}

/// The `path` and `size` records of a PAX header (the others are validated and dropped).
#[derive(Debug, Default, Clone)]
struct PaxRecords {
    path: Option<Vec<u8>>,
    size: Option<Vec<u8>>,
    any: bool,
}

/// TAR header logic, fed one header block at a time; it keeps what extended headers say about the next member.
///
/// ```
/// use spdl_source::tar_index::{HeaderStep, MemberData, TarParser, BLOCK};
///
/// let mut builder = tar::Builder::new(Vec::new());
/// let mut header = tar::Header::new_ustar();
/// header.set_size(2);
/// header.set_cksum();
/// builder.append_data(&mut header, "a.txt", &b"hi"[..])?;
/// let archive = builder.into_inner()?;
///
/// let mut parser = TarParser::new();
/// let step = parser.header(&archive[..BLOCK], 0)?;
/// assert_eq!(step, HeaderStep::Member { name: b"a.txt".to_vec(), size: 2, data: MemberData::Regular });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default, Clone)]
pub struct TarParser {
    long_name: Option<Vec<u8>>,
    pax: PaxRecords,
    pax_global: PaxRecords,
}

impl TarParser {
    /// A parser at the start of an archive.
    pub fn new() -> Self {
        TarParser::default()
    }

    /// Whether a GNU long name or a local PAX header is waiting for its member (the archive must not end here).
    pub fn pending(&self) -> bool {
        self.long_name.is_some() || self.pax.any
    }

    /// Reads the header block `block` (512 bytes, not all zero) that starts at `offset` in the archive.
    ///
    /// # Errors
    ///
    /// A bad checksum, an unreadable size field, metadata larger than [`MAX_META_BYTES`], an invalid PAX `size`.
    pub fn header(&mut self, block: &[u8], offset: u64) -> Result<HeaderStep, TarFormatError> {
        let Some(block) = block.get(..BLOCK) else {
            return Err(TarFormatError::TruncatedHeader { offset, remaining: block.len() as u64 });
        };
        if !checksum_ok(block) {
            return Err(TarFormatError::BadChecksum { offset });
        }
        let typeflag = block[156];
        let mut size = number(&block[124..136], "size", offset)?;
        let meta = match typeflag {
            b'L' => Some(MetaKind::GnuLongName),
            b'K' => Some(MetaKind::GnuLongLink),
            b'x' => Some(MetaKind::Pax),
            b'g' => Some(MetaKind::PaxGlobal),
            _ => None,
        };
        if let Some(kind) = meta {
            if size > MAX_META_BYTES {
                return Err(TarFormatError::MetadataTooLarge { kind: kind.describe(), offset, size });
            }
            return Ok(HeaderStep::Meta { kind, size });
        }
        let pax = std::mem::take(&mut self.pax);
        let long_name = self.long_name.take();
        if let Some(value) = pax.size.as_ref().or(self.pax_global.size.as_ref()) {
            size = pax_size(value, offset)?;
        }
        let name = if let Some(path) = pax.path.or_else(|| self.pax_global.path.clone()) {
            path
        } else if let Some(long) = long_name {
            long
        } else {
            let name = cstr(&block[..100]);
            // ustar (not the old GNU magic "ustar  \0") splits long paths into prefix + "/" + name.
            if &block[257..262] == b"ustar" && block[345] != 0 && &block[257..265] != b"ustar  \0" {
                let prefix = cstr(&block[345..500]);
                let mut full = Vec::with_capacity(prefix.len() + 1 + name.len());
                full.extend_from_slice(prefix);
                full.push(b'/');
                full.extend_from_slice(name);
                full
            } else {
                name.to_vec()
            }
        };
        let data = match typeflag {
            b'0' | 0 | b'7' => MemberData::Regular,
            b'1'..=b'6' => MemberData::NoData,
            _ => MemberData::Skipped,
        };
        Ok(HeaderStep::Member { name, size, data })
    }

    /// Takes the data of the metadata that [`TarParser::header`] announced (at `offset`, its header's offset).
    ///
    /// # Errors
    ///
    /// A PAX record that is malformed (no length, a length that overruns the data, no `=`).
    pub fn metadata(&mut self, kind: MetaKind, data: &[u8], offset: u64) -> Result<(), TarFormatError> {
        match kind {
            MetaKind::GnuLongName => self.long_name = Some(cstr(data).to_vec()),
            MetaKind::GnuLongLink => {}
            MetaKind::Pax => self.pax = parse_pax(data, offset)?,
            MetaKind::PaxGlobal => {
                let records = parse_pax(data, offset)?;
                if records.path.is_some() {
                    self.pax_global.path = records.path;
                }
                if records.size.is_some() {
                    self.pax_global.size = records.size;
                }
                self.pax_global.any |= records.any;
            }
        }
        Ok(())
    }
}

/// A regular member of an archive in memory: its path and where its data lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TarMember {
    /// The path, as stored (usually UTF-8).
    pub name: Vec<u8>,
    /// Where its data starts in the buffer.
    pub offset: usize,
    /// The size of its data (`buffer[offset..offset + size]` is in bounds).
    pub size: usize,
}

/// The regular members of an archive in memory, in archive order, up to the end of the archive or to the first
/// error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TarIndex {
    /// The members read before the end (or before the error).
    pub members: Vec<TarMember>,
    /// Why the scan stopped early, if it did: the members before it are valid.
    pub error: Option<TarFormatError>,
}

impl TarIndex {
    /// The members, or the error if the archive is malformed anywhere.
    ///
    /// # Errors
    ///
    /// The first [`TarFormatError`] of the scan.
    pub fn into_result(self) -> Result<Vec<TarMember>, TarFormatError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.members),
        }
    }
}

/// Indexes the regular members of the TAR archive `buf`: the path of each and the range of its data in `buf`.
///
/// The scan ends at the end of `buf` (on a block boundary) or at two zero blocks in a row (one zero block is
/// padding); what follows them is not read. A malformed or truncated archive ends the scan with
/// [`TarIndex::error`], after the members that precede the fault.
///
/// ```
/// use spdl_source::tar_index::index;
///
/// let mut builder = tar::Builder::new(Vec::new());
/// for (name, data) in [("a/0.jpg", &b"jpeg"[..]), ("a/0.cls", b"7")] {
///     let mut header = tar::Header::new_gnu();
///     header.set_size(data.len() as u64);
///     header.set_cksum();
///     builder.append_data(&mut header, name, data)?;
/// }
/// let archive = builder.into_inner()?;
///
/// let members = index(&archive).into_result()?;
/// assert_eq!(members[0].name, b"a/0.jpg");
/// let first = &archive[members[0].offset..members[0].offset + members[0].size];
/// assert_eq!(first, b"jpeg");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn index(buf: &[u8]) -> TarIndex {
    let mut members = Vec::new();
    let error = scan(buf, &mut members).err();
    TarIndex { members, error }
}

fn scan(buf: &[u8], members: &mut Vec<TarMember>) -> Result<(), TarFormatError> {
    let mut parser = TarParser::new();
    let mut pos = 0usize;
    loop {
        let mut header_offset = pos;
        let Some(mut block) = next_block(buf, &mut pos)? else {
            if parser.pending() {
                return Err(TarFormatError::DanglingExtendedHeader);
            }
            return Ok(());
        };
        if is_zero(block) {
            // One zero block may be padding; two in a row end the archive.
            header_offset = pos;
            match next_block(buf, &mut pos)? {
                Some(next) if !is_zero(next) => block = next,
                _ => return Ok(()),
            }
        }
        match parser.header(block, header_offset as u64)? {
            HeaderStep::Meta { kind, size } => {
                let range = data_range(buf, &mut pos, size, || kind.describe().to_owned())?;
                parser.metadata(kind, &buf[range], header_offset as u64)?;
            }
            HeaderStep::Member { name, size, data } => match data {
                MemberData::Regular => {
                    let range = data_range(buf, &mut pos, size, || String::from_utf8_lossy(&name).into_owned())?;
                    members.push(TarMember { name, offset: range.start, size: range.len() });
                }
                MemberData::Skipped => {
                    data_range(buf, &mut pos, size, || String::from_utf8_lossy(&name).into_owned())?;
                }
                MemberData::NoData => {}
            },
        }
    }
}

/// The next header block at `*pos`, `None` at the end of the data.
fn next_block<'a>(buf: &'a [u8], pos: &mut usize) -> Result<Option<&'a [u8]>, TarFormatError> {
    let rest = buf.len() - *pos;
    if rest == 0 {
        return Ok(None);
    }
    let Some(block) = buf.get(*pos..*pos + BLOCK) else {
        return Err(TarFormatError::TruncatedHeader { offset: *pos as u64, remaining: rest as u64 });
    };
    *pos += BLOCK;
    Ok(Some(block))
}

/// The range of `size` bytes of data at `*pos`, checked against the buffer; moves `*pos` past the data and its
/// padding (the padding may be missing at the very end).
fn data_range(
    buf: &[u8],
    pos: &mut usize,
    size: u64,
    member: impl FnOnce() -> String,
) -> Result<std::ops::Range<usize>, TarFormatError> {
    let rest = buf.len() - *pos;
    if size > rest as u64 {
        return Err(TarFormatError::TruncatedData {
            member: member(),
            size,
            remaining: rest as u64,
            offset: *pos as u64,
        });
    }
    // `size <= rest`, so it fits in usize.
    let size = size as usize;
    let range = *pos..*pos + size;
    let padded = size.div_ceil(BLOCK) * BLOCK;
    *pos += padded.min(rest);
    Ok(range)
}

/// Buffer space reserved ahead for one member's data read by [`TarReader::read_data`]: the header's size is
/// untrusted, so larger members grow their buffer as their bytes arrive.
const PREALLOC_LIMIT: u64 = 16 << 20;

/// A failure of [`TarReader`]: the archive is malformed or truncated, or the underlying reader failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TarReadError {
    /// The archive is malformed or truncated.
    #[error(transparent)]
    Format(#[from] TarFormatError),
    /// The underlying reader failed (its error is the [`std::error::Error::source`]).
    #[error("TAR stream: read failed at offset {offset}")]
    Io {
        /// Where in the archive the failed read started.
        offset: u64,
        /// The reader's error.
        #[source]
        source: std::io::Error,
    },
}

impl From<TarReadError> for std::io::Error {
    /// An I/O error of the same kind as the reader's (`InvalidData` for a malformed archive) that carries the
    /// [`TarReadError`] (see [`std::io::Error::get_ref`]).
    fn from(err: TarReadError) -> Self {
        let kind = match &err {
            TarReadError::Format(_) => std::io::ErrorKind::InvalidData,
            TarReadError::Io { source, .. } => source.kind(),
        };
        std::io::Error::new(kind, err)
    }
}

/// A regular member of a streamed archive, as [`TarReader::next_member`] returns it; its data is read with
/// [`TarReader::read_data`] (or skipped by the next call to [`TarReader::next_member`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TarEntry {
    /// The path, as stored (usually UTF-8), resolved like [`index`] resolves it.
    pub name: Vec<u8>,
    /// The size of its data, as declared (the bytes may turn out not to be there).
    pub size: u64,
    /// Where its data starts in the archive.
    pub offset: u64,
}

/// The member whose data comes next in the stream.
#[derive(Debug)]
struct Unread {
    name: Vec<u8>,
    /// Declared size of the data.
    size: u64,
    /// Offset of the data in the archive.
    offset: u64,
}

/// The regular members of a TAR archive read from any [`std::io::Read`] (a file, a pipe, a network body), in
/// archive order, with the same header logic ([`TarParser`]) and the same rules as [`index`]: ustar prefixes, GNU
/// long names, PAX `path` and `size` records, base-256 sizes; directories, links, devices and FIFOs are skipped,
/// and so are the data blocks of other types; two zero blocks in a row (or the end of the stream on a block
/// boundary) end the archive.
///
/// The reader is consumed in order and never seeks: [`TarReader::next_member`] returns a member's path and size,
/// [`TarReader::read_data`] appends its data to a buffer, and a member whose data is not wanted is skipped without
/// being kept. Hostile streams are bounded: metadata is at most [`MAX_META_BYTES`], a member's buffer is reserved
/// ahead for at most 16 MiB whatever its header declares (it grows only as bytes arrive), and a stream that ends
/// early is a [`TarFormatError::TruncatedData`] or [`TarFormatError::TruncatedHeader`] naming the member or the
/// offset. After an error (or the end), [`TarReader::next_member`] returns `Ok(None)`.
///
/// ```
/// use spdl_source::tar_index::TarReader;
///
/// let mut builder = tar::Builder::new(Vec::new());
/// for (name, data) in [("a/0.jpg", &b"jpeg"[..]), ("README", b"skipped"), ("a/0.cls", b"7")] {
///     let mut header = tar::Header::new_gnu();
///     header.set_size(data.len() as u64);
///     header.set_cksum();
///     builder.append_data(&mut header, name, data)?;
/// }
/// let archive = builder.into_inner()?;
///
/// // Any `Read` will do: here a slice of bytes.
/// let mut reader = TarReader::new(&archive[..]);
/// let mut got = Vec::new();
/// while let Some(entry) = reader.next_member()? {
///     if entry.name == b"README" {
///         continue; // its data is skipped by the next call
///     }
///     let mut data = Vec::new();
///     reader.read_data(&mut data)?;
///     got.push((String::from_utf8(entry.name)?, data));
/// }
/// assert_eq!(got, [("a/0.jpg".to_owned(), b"jpeg".to_vec()), ("a/0.cls".to_owned(), b"7".to_vec())]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct TarReader<R> {
    reader: R,
    parser: TarParser,
    /// Bytes of the archive consumed so far.
    offset: u64,
    /// The last member returned, while the stream is at its data (until [`TarReader::read_data`] reads it).
    unread: Option<Unread>,
    done: bool,
}

impl<R: std::io::Read> TarReader<R> {
    /// A reader at the start of the archive `reader` yields.
    pub fn new(reader: R) -> Self {
        TarReader { reader, parser: TarParser::new(), offset: 0, unread: None, done: false }
    }

    /// Bytes of the archive consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The underlying reader, wherever the archive was left.
    pub fn into_inner(self) -> R {
        self.reader
    }

    /// The next regular member, `None` at the end of the archive (or after an error). The data of the member
    /// returned before, if [`TarReader::read_data`] did not read it, is skipped first.
    ///
    /// # Errors
    ///
    /// [`TarReadError::Format`] for a malformed or truncated archive (a header cut short, a member whose data
    /// ends early, a bad checksum, metadata over [`MAX_META_BYTES`], a GNU long name or PAX header with no member
    /// after it, ...), [`TarReadError::Io`] when the reader fails.
    pub fn next_member(&mut self) -> Result<Option<TarEntry>, TarReadError> {
        if self.done {
            return Ok(None);
        }
        let next = self.advance();
        if !matches!(next, Ok(Some(_))) {
            self.done = true;
            self.unread = None;
        }
        next
    }

    /// Appends the data of the member [`TarReader::next_member`] returned last to `out`, then moves past its
    /// padding. Appends nothing if it was read already (or there is no member).
    ///
    /// # Errors
    ///
    /// [`TarFormatError::TruncatedData`] (naming the member) when the stream ends before its declared size,
    /// [`TarReadError::Io`] when the reader fails. Either ends the archive: [`TarReader::next_member`] then
    /// returns `Ok(None)`.
    pub fn read_data(&mut self, out: &mut Vec<u8>) -> Result<(), TarReadError> {
        let Some(Unread { name, size, offset }) = self.unread.take() else {
            return Ok(());
        };
        let result = self
            .read_exact_into(size, out, offset, || String::from_utf8_lossy(&name).into_owned())
            .and_then(|()| self.skip_padding(size));
        if result.is_err() {
            self.done = true;
        }
        result
    }

    fn advance(&mut self) -> Result<Option<TarEntry>, TarReadError> {
        if let Some(unread) = self.unread.take() {
            self.skip_data(&unread.name, unread.size, unread.offset)?;
        }
        loop {
            let mut header_offset = self.offset;
            let Some(mut block) = self.block()? else {
                if self.parser.pending() {
                    return Err(TarFormatError::DanglingExtendedHeader.into());
                }
                return Ok(None);
            };
            if is_zero(&block) {
                // One zero block may be padding; two in a row end the archive.
                header_offset = self.offset;
                match self.block()? {
                    Some(next) if !is_zero(&next) => block = next,
                    _ => return Ok(None),
                }
            }
            match self.parser.header(&block, header_offset)? {
                HeaderStep::Meta { kind, size } => {
                    // `size` is at most MAX_META_BYTES: the buffer grows only as the bytes arrive.
                    let mut data = Vec::new();
                    let offset = self.offset;
                    self.read_exact_into(size, &mut data, offset, || kind.describe().to_owned())?;
                    self.skip_padding(size)?;
                    self.parser.metadata(kind, &data, header_offset)?;
                }
                HeaderStep::Member { name, size, data } => match data {
                    MemberData::Regular => {
                        let offset = self.offset;
                        self.unread = Some(Unread { name: name.clone(), size, offset });
                        return Ok(Some(TarEntry { name, size, offset }));
                    }
                    MemberData::Skipped => {
                        let offset = self.offset;
                        self.skip_data(&name, size, offset)?;
                    }
                    MemberData::NoData => {}
                },
            }
        }
    }

    /// Reads into `buf` until it is full or the stream ends; returns the bytes read.
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize, TarReadError> {
        let mut got = 0;
        while got < buf.len() {
            match self.reader.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => return Err(TarReadError::Io { offset: self.offset + got as u64, source }),
            }
        }
        self.offset += got as u64;
        Ok(got)
    }

    /// The next header block, `None` at the end of the stream (on a block boundary).
    fn block(&mut self) -> Result<Option<[u8; BLOCK]>, TarReadError> {
        let offset = self.offset;
        let mut block = [0u8; BLOCK];
        match self.fill(&mut block)? {
            0 => Ok(None),
            BLOCK => Ok(Some(block)),
            got => Err(TarFormatError::TruncatedHeader { offset, remaining: got as u64 }.into()),
        }
    }

    /// Appends exactly `size` bytes to `out` (the data of `member`, at `offset`); a short stream is
    /// [`TarFormatError::TruncatedData`].
    fn read_exact_into(
        &mut self,
        size: u64,
        out: &mut Vec<u8>,
        offset: u64,
        member: impl FnOnce() -> String,
    ) -> Result<(), TarReadError> {
        out.reserve(usize::try_from(size.min(PREALLOC_LIMIT)).unwrap_or(0));
        let start = out.len();
        let read = std::io::Read::read_to_end(&mut std::io::Read::take(&mut self.reader, size), out);
        let got = (out.len() - start) as u64;
        self.offset += got;
        if let Err(source) = read {
            return Err(TarReadError::Io { offset: self.offset, source });
        }
        if got < size {
            return Err(TarFormatError::TruncatedData { member: member(), size, remaining: got, offset }.into());
        }
        Ok(())
    }

    /// Skips the `size` bytes of data of `name` (at `offset`) and their padding.
    fn skip_data(&mut self, name: &[u8], size: u64, offset: u64) -> Result<(), TarReadError> {
        let skipped = self.skip(size)?;
        if skipped < size {
            let member = String::from_utf8_lossy(name).into_owned();
            return Err(TarFormatError::TruncatedData { member, size, remaining: skipped, offset }.into());
        }
        self.skip_padding(size)
    }

    /// Skips the padding after `size` bytes of data (it may be missing at the very end of the stream).
    fn skip_padding(&mut self, size: u64) -> Result<(), TarReadError> {
        let pad = size.div_ceil(BLOCK as u64) * BLOCK as u64 - size;
        self.skip(pad)?;
        Ok(())
    }

    /// Reads and drops up to `n` bytes; returns how many there were.
    fn skip(&mut self, n: u64) -> Result<u64, TarReadError> {
        let offset = self.offset;
        let skipped = std::io::copy(&mut std::io::Read::take(&mut self.reader, n), &mut std::io::sink())
            .map_err(|source| TarReadError::Io { offset, source })?;
        self.offset += skipped;
        Ok(skipped)
    }
}

/// Whether a block is all zeros (an end-of-archive marker or padding).
pub fn is_zero(block: &[u8]) -> bool {
    block.iter().all(|&b| b == 0)
}

/// A NUL-terminated field.
fn cstr(field: &[u8]) -> &[u8] {
    field.iter().position(|&b| b == 0).map_or(field, |end| &field[..end])
}

/// A numeric header field: NUL/space-terminated octal, or GNU base-256 (top bit of the first byte set).
fn number(raw: &[u8], field: &'static str, offset: u64) -> Result<u64, TarFormatError> {
    let invalid = || TarFormatError::InvalidNumber { offset, field, raw: raw.to_vec() };
    if let Some(&first) = raw.first()
        && first & 0x80 != 0
    {
        if first == 0xFF {
            return Err(TarFormatError::NegativeNumber { offset, field });
        }
        let mut value = u64::from(first & 0x7F);
        for &byte in &raw[1..] {
            if value >> 56 != 0 {
                return Err(invalid());
            }
            value = (value << 8) | u64::from(byte);
        }
        return Ok(value);
    }
    let text = trim(cstr(raw));
    let mut value = 0u64;
    for &c in text {
        if !(b'0'..=b'7').contains(&c) {
            return Err(invalid());
        }
        // At most 12 octal digits (36 bits): no overflow.
        value = (value << 3) | u64::from(c - b'0');
    }
    Ok(value)
}

/// `text` without leading and trailing ASCII whitespace.
fn trim(text: &[u8]) -> &[u8] {
    text.trim_ascii()
}

/// The header checksum: the sum of its bytes with the checksum field read as eight spaces, as unsigned bytes
/// (or, as some old writers computed it, signed ones).
fn checksum_ok(block: &[u8]) -> bool {
    let Ok(stored) = number(&block[148..156], "checksum", 0) else {
        return false;
    };
    // Whole-block sums less the checksum field's own bytes.
    let fold = |lanes: u64| (lanes & 0xFFFF) + ((lanes >> 16) & 0xFFFF) + ((lanes >> 32) & 0xFFFF) + (lanes >> 48);
    let sum = |bytes: &[u8]| -> u64 {
        let mut chunks = bytes.chunks_exact(8);
        // Eight bytes at a time, added pairwise into four 16-bit lanes (at most 510 per word and lane, so 128
        // words fit): a few operations per eight bytes instead of eight dependent additions.
        let mut total = 0u64;
        let mut lanes = 0u64;
        for (i, chunk) in (&mut chunks).enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            let word = u64::from_le_bytes(word);
            lanes += (word & 0x00FF_00FF_00FF_00FF) + ((word >> 8) & 0x00FF_00FF_00FF_00FF);
            if i % 128 == 127 {
                total += fold(lanes);
                lanes = 0;
            }
        }
        total += fold(lanes);
        total + chunks.remainder().iter().map(|&b| u64::from(b)).sum::<u64>()
    };
    let unsigned = sum(block) - sum(&block[148..156]) + 8 * u64::from(b' ');
    if stored == unsigned {
        return true;
    }
    let high = |bytes: &[u8]| bytes.iter().filter(|&&b| b >= 0x80).count() as u64;
    let high = high(block) - high(&block[148..156]);
    stored + 256 * high == unsigned
}

/// PAX extended header records: `"<len> <key>=<value>\n"`, up to the data's end or NUL padding.
fn parse_pax(data: &[u8], offset: u64) -> Result<PaxRecords, TarFormatError> {
    let bad = |cause: String| TarFormatError::InvalidPaxRecord { offset, cause };
    let mut records = PaxRecords::default();
    let mut pos = 0usize;
    while pos < data.len() {
        if data[pos] == 0 {
            break;
        }
        let Some(space) = data[pos..].iter().position(|&b| b == b' ').map(|i| pos + i) else {
            return Err(bad("record without a length".to_owned()));
        };
        let digits = &data[pos..space];
        let Some(length) = parse_int(digits) else {
            return Err(bad(format!("invalid record length {}", py_bytes_repr(digits))));
        };
        let overrun = || bad("a record overruns the header".to_owned());
        let Ok(length) = usize::try_from(length) else {
            return Err(overrun());
        };
        let end = pos.checked_add(length).ok_or_else(overrun)?;
        if length <= space - pos + 1 || end > data.len() || data[end - 1] != b'\n' {
            return Err(overrun());
        }
        let record = &data[space + 1..end - 1];
        let Some(eq) = record.iter().position(|&b| b == b'=') else {
            return Err(bad("record without '='".to_owned()));
        };
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        match key {
            b"path" => records.path = Some(value.to_vec()),
            b"size" => records.size = Some(value.to_vec()),
            _ => {}
        }
        records.any = true;
        pos = end;
    }
    Ok(records)
}

/// A decimal integer as Python's `int()` reads one from ASCII: surrounding whitespace, an optional sign, digits
/// (single underscores between them allowed). `None` if it is not one or does not fit in an `i128`.
fn parse_int(text: &[u8]) -> Option<i128> {
    let text = trim(text);
    let (negative, digits) = match text.first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || digits.first() == Some(&b'_') || digits.last() == Some(&b'_') {
        return None;
    }
    let mut value: i128 = 0;
    let mut previous_underscore = false;
    for &c in digits {
        if c == b'_' {
            if previous_underscore {
                return None;
            }
            previous_underscore = true;
            continue;
        }
        previous_underscore = false;
        if !c.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(i128::from(c - b'0'))?;
    }
    Some(if negative { -value } else { value })
}

/// A PAX `size` value as a size.
fn pax_size(value: &[u8], offset: u64) -> Result<u64, TarFormatError> {
    match parse_int(value) {
        Some(v) if v < 0 => Err(TarFormatError::InvalidPaxSize { offset, value: value.to_vec(), negative: true }),
        Some(v) => u64::try_from(v).map_err(|_| TarFormatError::InvalidPaxSize {
            offset,
            value: value.to_vec(),
            negative: false,
        }),
        None => Err(TarFormatError::InvalidPaxSize { offset, value: value.to_vec(), negative: false }),
    }
}

/// A path as Python's `repr()` writes the `str` that `bytes.decode("utf-8", "surrogateescape")` gives.
pub fn py_repr(name: &[u8]) -> String {
    let mut text = String::new();
    let mut has_single = false;
    let mut has_double = false;
    for chunk in name.utf8_chunks() {
        has_single |= chunk.valid().contains('\'');
        has_double |= chunk.valid().contains('"');
    }
    let quote = if has_single && !has_double { '"' } else { '\'' };
    text.push(quote);
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => text.push_str("\\\\"),
                '\n' => text.push_str("\\n"),
                '\r' => text.push_str("\\r"),
                '\t' => text.push_str("\\t"),
                c if c == quote => {
                    text.push('\\');
                    text.push(c);
                }
                c if (c as u32) < 0x20 || (0x7F..0xA0).contains(&(c as u32)) => {
                    let _ = write!(text, "\\x{:02x}", c as u32);
                }
                c => text.push(c),
            }
        }
        for &b in chunk.invalid() {
            let _ = write!(text, "\\udc{b:02x}");
        }
    }
    text.push(quote);
    text
}

/// Bytes as Python's `repr()` writes them (`b'...'`).
pub fn py_bytes_repr(raw: &[u8]) -> String {
    let quote = if raw.contains(&b'\'') && !raw.contains(&b'"') { '"' } else { '\'' };
    let mut text = String::from("b");
    text.push(quote);
    for &b in raw {
        match b {
            b'\\' => text.push_str("\\\\"),
            b'\n' => text.push_str("\\n"),
            b'\r' => text.push_str("\\r"),
            b'\t' => text.push_str("\\t"),
            b if char::from(b) == quote => {
                text.push('\\');
                text.push(quote);
            }
            0x20..0x7F => text.push(char::from(b)),
            b => {
                let _ = write!(text, "\\x{b:02x}");
            }
        }
    }
    text.push(quote);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_header(size: u64) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_size(size);
        header.set_mode(0o644);
        header.set_cksum();
        header
    }

    fn gnu_archive(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, data) in members {
            builder.append_data(&mut file_header(data.len() as u64), name, *data).unwrap();
        }
        builder.into_inner().unwrap()
    }

    fn contents(buf: &[u8]) -> Vec<(String, Vec<u8>)> {
        index(buf)
            .into_result()
            .unwrap()
            .into_iter()
            .map(|m| (String::from_utf8(m.name).unwrap(), buf[m.offset..m.offset + m.size].to_vec()))
            .collect()
    }

    /// Rewrites the size field of the header at `at` and its checksum.
    fn set_size(buf: &mut [u8], at: usize, size: u64) {
        buf[at + 124..at + 136].copy_from_slice(format!("{size:011o}\0").as_bytes());
        buf[at + 148..at + 156].fill(b' ');
        let sum: u64 = buf[at..at + BLOCK].iter().map(|&b| u64::from(b)).sum();
        buf[at + 148..at + 156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    }

    const LONG: &str = "deep/deep/deep/deep/deep/deep/deep/deep/deep/deep/deep/deep/deep/deep/deep/deep/deep/deep/\
                        deep/deep/deep/deep/deep/deep/deep/name.txt";

    /// Regular files (one with a GNU long name), a directory, a symlink with a long link name, an empty file and a
    /// contiguous file; returns the archive and the long member's data.
    fn gnu_types_archive() -> (Vec<u8>, Vec<u8>) {
        let mut builder = tar::Builder::new(Vec::new());
        builder.append_data(&mut file_header(5), "a.txt", &b"hello"[..]).unwrap();
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_size(0);
        dir.set_cksum();
        builder.append_data(&mut dir, "dir/", &b""[..]).unwrap();
        let data: Vec<u8> = (0..=255u8).cycle().take(768).collect();
        builder.append_data(&mut file_header(768), LONG, &data[..]).unwrap();
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_size(0);
        builder.append_link(&mut link, "l".repeat(120), LONG).unwrap();
        builder.append_data(&mut file_header(0), "empty", &b""[..]).unwrap();
        let mut contiguous = file_header(2);
        contiguous.set_entry_type(tar::EntryType::Continuous);
        contiguous.set_cksum();
        builder.append_data(&mut contiguous, "contiguous", &b"cc"[..]).unwrap();
        (builder.into_inner().unwrap(), data)
    }

    #[test]
    fn tar_gnu_long_names_links_and_types() {
        let (archive, data) = gnu_types_archive();

        assert_eq!(
            contents(&archive),
            vec![
                ("a.txt".to_owned(), b"hello".to_vec()),
                (LONG.to_owned(), data),
                ("empty".to_owned(), vec![]),
                ("contiguous".to_owned(), b"cc".to_vec()),
            ]
        );
        // Offsets point into the buffer: the first member's data is the block after its header.
        assert_eq!(index(&archive).members[0].offset, BLOCK);
    }

    /// A PAX archive as Python's tarfile writes one: a global header, then a local header per long path.
    fn pax_archive() -> Vec<u8> {
        fn push(out: &mut Vec<u8>, typeflag: u8, name: &str, data: &[u8]) {
            let mut header = tar::Header::new_ustar();
            header.as_mut_bytes()[..name.len()].copy_from_slice(name.as_bytes());
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::new(typeflag));
            header.set_cksum();
            out.extend_from_slice(header.as_bytes());
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
        }
        let mut out = Vec::new();
        push(&mut out, b'g', "pax_global_header", b"15 comment=abc\n");
        let body = format!(" path={LONG}\n");
        let mut length = body.len() + 1;
        while length.to_string().len() + body.len() != length {
            length += 1;
        }
        push(&mut out, b'x', "PaxHeader/long", format!("{length}{body}").as_bytes());
        push(&mut out, b'0', "truncated-name", b"long");
        // A size record overrides the header's size field (0 here).
        push(&mut out, b'x', "PaxHeader/sized", b"9 size=3\n");
        push(&mut out, b'0', "sized", b"");
        out.extend_from_slice(b"abc");
        out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
        push(&mut out, b'0', "plain", b"xy");
        out.extend_from_slice(&[0; 2 * BLOCK]);
        out
    }

    #[test]
    fn tar_pax_path_and_size_records() {
        assert_eq!(
            contents(&pax_archive()),
            vec![
                (LONG.to_owned(), b"long".to_vec()),
                ("sized".to_owned(), b"abc".to_vec()),
                ("plain".to_owned(), b"xy".to_vec()),
            ]
        );
    }

    #[test]
    fn tar_builder_pax_extensions() {
        // The tar crate's own PAX writer (a `path` record for a long name).
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_ustar();
        header.set_size(1);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_pax_extensions([("path", LONG.as_bytes())]).unwrap();
        builder.append_data(&mut header, "short", &b"p"[..]).unwrap();
        let archive = builder.into_inner().unwrap();
        assert_eq!(contents(&archive), vec![(LONG.to_owned(), b"p".to_vec())]);
    }

    #[test]
    fn tar_ustar_prefix_and_base256_size() {
        let prefix = "p".repeat(120);
        let mut header = tar::Header::new_ustar();
        header.set_path(format!("{prefix}/file.bin")).unwrap();
        header.set_size(3);
        header.set_mode(0o644);
        header.set_cksum();
        let mut archive = header.as_bytes().to_vec();
        archive.extend_from_slice(b"abc");
        archive.resize(2 * BLOCK, 0);
        assert_eq!(contents(&archive), vec![(format!("{prefix}/file.bin"), b"abc".to_vec())]);

        // GNU base-256: the top bit of the first byte, then a big-endian number.
        let mut archive = gnu_archive(&[("b", b"xyz")]);
        archive[124..136].copy_from_slice(&[0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3]);
        archive[148..156].fill(b' ');
        let sum: u64 = archive[..BLOCK].iter().map(|&b| u64::from(b)).sum();
        archive[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        assert_eq!(contents(&archive), vec![("b".to_owned(), b"xyz".to_vec())]);
        archive[124] = 0xFF;
        archive[148..156].fill(b' ');
        let sum: u64 = archive[..BLOCK].iter().map(|&b| u64::from(b)).sum();
        archive[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let error = index(&archive).error.unwrap().to_string();
        assert!(error.contains("negative size"), "{error}");
    }

    #[test]
    fn tar_empty_padding_and_end() {
        assert_eq!(index(b""), TarIndex::default());
        assert_eq!(index(&[0; 2 * BLOCK]), TarIndex::default());
        let single = gnu_archive(&[("a", b"x")]);
        let mut padded = vec![0; BLOCK];
        padded.extend_from_slice(&single);
        assert_eq!(contents(&padded), vec![("a".to_owned(), b"x".to_vec())]);
        let mut trailing = single.clone();
        trailing.extend_from_slice(&b"garbage".repeat(100));
        assert_eq!(contents(&trailing), vec![("a".to_owned(), b"x".to_vec())]);
        // Without end-of-archive blocks, the data's end (on a block boundary) is the end.
        assert_eq!(contents(&single[..2 * BLOCK]), vec![("a".to_owned(), b"x".to_vec())]);
    }

    #[test]
    fn tar_truncated_archives_keep_the_members_before() {
        let archive = gnu_archive(&[("a.txt", b"hello"), ("b.bin", &[7; 768])]);
        // Cut inside b.bin's data: a.txt is indexed, then the error names b.bin.
        let cut = index(&archive[..1636]);
        assert_eq!(cut.members.len(), 1);
        let error = cut.error.unwrap().to_string();
        assert!(error.contains("truncated") && error.contains("'b.bin'") && error.contains("768"), "{error}");
        let error = index(&archive[..100]).error.unwrap().to_string();
        assert_eq!(error, "TAR archive is truncated: 100 bytes at offset 0, a header needs 512");
        let error = index(&archive[..BLOCK]).error.unwrap().to_string();
        assert_eq!(error, "TAR archive is truncated: member 'a.txt' declares 5 bytes, 0 remain (offset 512)");

        // An 8 GiB size on a few KiB: refused before anything is sliced.
        let mut huge = archive.clone();
        set_size(&mut huge, 0, 8u64.pow(11) - 1);
        let error = index(&huge).error.unwrap().to_string();
        assert!(error.contains("declares 8589934591 bytes"), "{error}");

        // A GNU long name as the archive's last header.
        let long = gnu_archive(&[(LONG, b"x")]);
        let error = index(&long[..2 * BLOCK]).error.unwrap();
        assert_eq!(error, TarFormatError::DanglingExtendedHeader);
    }

    #[test]
    fn tar_hostile_headers() {
        let archive = gnu_archive(&[("a.txt", b"hello"), ("b.bin", b"bin")]);
        let error = index(&[b'x'; 1024]).error.unwrap().to_string();
        assert_eq!(error, "TAR header at offset 0 has a bad checksum (not a TAR archive?)");
        let mut flipped = archive.clone();
        flipped[1024] ^= 1;
        let bad = index(&flipped);
        assert_eq!(bad.members.len(), 1);
        assert_eq!(bad.error, Some(TarFormatError::BadChecksum { offset: 1024 }));

        // A GNU long name that declares 64 MiB is refused as metadata, whatever follows.
        let mut long = gnu_archive(&[(LONG, b"x")]);
        set_size(&mut long, 0, 64 << 20);
        let error = index(&long).error.unwrap().to_string();
        assert_eq!(error, format!("TAR GNU long name at offset 0 declares {} bytes (more than 1048576)", 64 << 20));

        // An octal field with a non-octal digit.
        let mut invalid = archive.clone();
        invalid[124..136].copy_from_slice(b"0000000009x\0");
        invalid[148..156].fill(b' ');
        let sum: u64 = invalid[..BLOCK].iter().map(|&b| u64::from(b)).sum();
        invalid[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let error = index(&invalid).error.unwrap().to_string();
        assert_eq!(error, "TAR header at offset 0: invalid size field b'0000000009x\\x00'");
    }

    #[test]
    fn tar_lying_pax_records() {
        let cases: [(&[u8], &str); 5] = [
            (b"0 path=x\n", "a record overruns the header"),
            (b"99 path=x\n", "a record overruns the header"),
            (b"x path=x\n", "invalid record length b'x'"),
            (b"8 pathx\n", "record without '='"),
            (b"nospace", "record without a length"),
        ];
        for (record, cause) in cases {
            let mut header = tar::Header::new_ustar();
            header.as_mut_bytes()[..9].copy_from_slice(b"PaxHeader");
            header.set_size(record.len() as u64);
            header.set_entry_type(tar::EntryType::XHeader);
            header.set_cksum();
            let mut archive = header.as_bytes().to_vec();
            archive.extend_from_slice(record);
            archive.resize(2 * BLOCK, 0);
            archive.extend_from_slice(&gnu_archive(&[("u", b"u")]));
            let error = index(&archive).error.unwrap().to_string();
            assert_eq!(error, format!("TAR PAX header at offset 0: {cause}"));
        }
        // A size record that is not a number, and a negative one.
        for (value, message) in [(&b"abc"[..], "invalid size b'abc'"), (b"-3", "negative size")] {
            let record = [&b"size="[..], value, b"\n"].concat();
            let record = [format!("{} ", record.len() + 3).as_bytes(), &record].concat();
            let mut header = tar::Header::new_ustar();
            header.set_size(record.len() as u64);
            header.set_entry_type(tar::EntryType::XHeader);
            header.set_cksum();
            let mut archive = header.as_bytes().to_vec();
            archive.extend_from_slice(&record);
            archive.resize(2 * BLOCK, 0);
            archive.extend_from_slice(&gnu_archive(&[("u", b"u")]));
            let error = index(&archive).error.unwrap().to_string();
            assert_eq!(error, format!("TAR PAX header before offset 1024: {message}"));
        }
    }

    #[test]
    fn tar_checksum_matches_the_definition() {
        // Pseudo-random blocks (bytes of every value, many >= 0x80): the word-wise sum must equal the byte-wise
        // one, unsigned and signed.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for round in 0..200 {
            let mut block = [0u8; BLOCK];
            for b in block.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *b = if round % 2 == 0 { (state >> 24) as u8 } else { 0xFF - (state % 3) as u8 };
            }
            block[148..156].fill(b' ');
            let unsigned: i64 = block.iter().map(|&b| i64::from(b)).sum();
            let signed: i64 = block.iter().map(|&b| i64::from(b as i8)).sum();
            for (value, ok) in [(unsigned, true), (signed, true), (unsigned + 1, false)] {
                if value < 0 {
                    continue;
                }
                block[148..156].copy_from_slice(format!("{value:07o}\0").as_bytes());
                // The field's own bytes are read as spaces, so rewriting it keeps the sums.
                assert_eq!(checksum_ok(&block), ok, "round {round}, value {value}");
            }
            block[148..156].fill(b' ');
        }
    }

    /// A streamed member: its name, and its data unless it was skipped.
    type Streamed = (Vec<u8>, Option<Vec<u8>>);

    /// The members a [`TarReader`] reads from `bytes` (the data of every `skip_every`-th member skipped, the
    /// others read), and the error it stopped at.
    fn stream(bytes: &[u8], skip_every: usize) -> (Vec<Streamed>, Option<TarReadError>) {
        let mut reader = TarReader::new(bytes);
        let mut members = Vec::new();
        loop {
            match reader.next_member() {
                Ok(None) => return (members, None),
                Err(e) => {
                    assert!(matches!(reader.next_member(), Ok(None)), "an error ends the archive");
                    return (members, Some(e));
                }
                Ok(Some(entry)) => {
                    if skip_every != 0 && members.len() % skip_every == 0 {
                        members.push((entry.name, None));
                        continue;
                    }
                    let mut data = Vec::new();
                    if let Err(e) = reader.read_data(&mut data) {
                        assert!(matches!(reader.next_member(), Ok(None)), "an error ends the archive");
                        return (members, Some(e));
                    }
                    assert_eq!(data.len() as u64, entry.size);
                    members.push((entry.name, Some(data)));
                }
            }
        }
    }

    #[test]
    fn tar_reader_agrees_with_index_on_every_cut() {
        let mut ustar = tar::Header::new_ustar();
        ustar.set_path(format!("{}/file.bin", "p".repeat(120))).unwrap();
        ustar.set_size(3);
        ustar.set_cksum();
        let mut prefixed = ustar.as_bytes().to_vec();
        prefixed.extend_from_slice(b"abc");
        prefixed.resize(2 * BLOCK, 0);
        let mut padded = vec![0; BLOCK];
        padded.extend_from_slice(&gnu_archive(&[("a", b"x"), ("b", &[1; 600])]));
        let mut sparse = gnu_archive(&[("s", b"sparse data"), ("after", b"kept")]);
        sparse[156] = b'S';
        set_size(&mut sparse, 0, 11);
        let archives = [gnu_types_archive().0, pax_archive(), prefixed, padded, sparse];
        for archive in &archives {
            // Every cut near a block boundary and a sample of the others.
            let cuts = (0..=archive.len()).filter(|n| n % 37 == 0 || matches!(n % BLOCK, 0 | 1 | 511));
            for cut in cuts {
                let bytes = &archive[..cut];
                let indexed = index(bytes);
                for skip_every in [0, 2] {
                    let (members, error) = stream(bytes, skip_every);
                    let names: Vec<&[u8]> = members.iter().map(|(n, _)| &n[..]).collect();
                    let expected: Vec<&[u8]> = indexed.members.iter().map(|m| &m.name[..]).collect();
                    // A member whose data is cut is returned by the stream before the error, not by the index.
                    let cut_member = matches!(
                        indexed.error,
                        Some(TarFormatError::TruncatedData { ref member, .. })
                            if names.len() == expected.len() + 1 && names.last() == Some(&member.as_bytes())
                    );
                    let names = if cut_member { &names[..expected.len()] } else { &names[..] };
                    assert_eq!(names, expected, "cut {cut}");
                    for ((_, data), m) in members.iter().zip(&indexed.members) {
                        if let Some(data) = data {
                            assert_eq!(&data[..], &bytes[m.offset..m.offset + m.size], "cut {cut}");
                        }
                    }
                    let error = error.map(|e| match e {
                        TarReadError::Format(e) => e,
                        TarReadError::Io { .. } => panic!("a slice does not fail: {e}"),
                    });
                    assert_eq!(error, indexed.error, "cut {cut}, skip every {skip_every}");
                }
            }
        }
    }

    /// A reader that hands out one byte per call, then fails after `fail_at` bytes.
    struct Trickle<'a> {
        data: &'a [u8],
        fail_at: usize,
        pos: usize,
    }

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.pos == self.fail_at {
                return Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "peer went away"));
            }
            let Some(&b) = self.data.get(self.pos) else { return Ok(0) };
            if buf.is_empty() {
                return Ok(0);
            }
            buf[0] = b;
            self.pos += 1;
            Ok(1)
        }
    }

    #[test]
    fn tar_reader_short_reads_and_reader_errors() {
        let archive = pax_archive();
        let whole = Trickle { data: &archive, fail_at: usize::MAX, pos: 0 };
        let mut reader = TarReader::new(whole);
        let mut names = Vec::new();
        while let Some(entry) = reader.next_member().unwrap() {
            let mut data = Vec::new();
            reader.read_data(&mut data).unwrap();
            names.push((String::from_utf8(entry.name).unwrap(), data));
        }
        assert_eq!(names, contents(&archive));

        // The reader fails inside the PAX header after the first member: the error is the reader's, with its
        // offset and kind.
        let failing = Trickle { data: &archive, fail_at: 6 * BLOCK + 10, pos: 0 };
        let (members, error) = {
            let mut reader = TarReader::new(failing);
            let first = reader.next_member().unwrap().unwrap();
            (first, reader.next_member().unwrap_err())
        };
        assert_eq!(members.name, LONG.as_bytes());
        assert!(matches!(error, TarReadError::Io { offset, .. } if offset == 6 * BLOCK as u64 + 10), "{error}");
        let io: std::io::Error = error.into();
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
        assert_eq!(io.to_string(), "TAR stream: read failed at offset 3082");
        let cause = std::error::Error::source(&io).map(|e| e.to_string());
        assert_eq!(cause.as_deref(), Some("peer went away"));
        assert!(io.get_ref().is_some_and(|e| e.is::<TarReadError>()));
    }

    #[test]
    fn tar_reader_does_not_trust_declared_sizes() {
        // 8 GiB declared on a few KiB: the buffer is reserved for 16 MiB at most, and the cut is named.
        let mut huge = gnu_archive(&[("a.bin", b"abc")]);
        set_size(&mut huge, 0, 8u64.pow(11) - 1);
        let mut reader = TarReader::new(&huge[..]);
        let entry = reader.next_member().unwrap().unwrap();
        assert_eq!(entry.size, 8u64.pow(11) - 1);
        let mut data = Vec::new();
        let error = reader.read_data(&mut data).unwrap_err();
        assert!(data.capacity() <= PREALLOC_LIMIT as usize + BLOCK, "{}", data.capacity());
        let message = error.to_string();
        assert!(message.contains("'a.bin'") && message.contains("declares 8589934591 bytes"), "{message}");
        assert!(matches!(reader.next_member(), Ok(None)));

        // Skipped, the same lie is the same error.
        let mut reader = TarReader::new(&huge[..]);
        reader.next_member().unwrap().unwrap();
        let error = reader.next_member().unwrap_err();
        assert!(matches!(error, TarReadError::Format(TarFormatError::TruncatedData { .. })), "{error}");

        // Metadata over the bound is refused from its header.
        let mut long = gnu_archive(&[(LONG, b"x")]);
        set_size(&mut long, 0, 64 << 20);
        let error = TarReader::new(&long[..]).next_member().unwrap_err();
        assert!(matches!(error, TarReadError::Format(TarFormatError::MetadataTooLarge { .. })), "{error}");
    }

    #[test]
    fn tar_reprs_follow_python() {
        assert_eq!(py_repr(b"a.txt"), "'a.txt'");
        assert_eq!(py_repr("it's".as_bytes()), "\"it's\"");
        assert_eq!(py_repr(b"a\nb\xff"), "'a\\nb\\udcff'");
        assert_eq!(py_repr("ünï".as_bytes()), "'ünï'");
        assert_eq!(py_bytes_repr(b"0\x00'"), "b\"0\\x00'\"");
    }
}
