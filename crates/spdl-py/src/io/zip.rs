//! The ZIP side of NumPy's `.npz` archives: the central directory (ZIP64 included) read from an archive in
//! memory, each entry's payload located through its local header, the entry table checked against the archive
//! and a decompression budget, and raw DEFLATE inflated into exactly the declared size (a larger stream is an
//! error once one byte more comes out, so a zip bomb costs at most its declared size).
//!
//! As Python's `zipfile`, the directory is found from the end-of-central-directory record, bytes prepended to
//! the archive shift every offset, and names are UTF-8 when the entry says so, else code page 437.

use miniz_oxide::inflate::TINFLStatus;
use miniz_oxide::inflate::core::{DecompressorOxide, decompress, inflate_flags};
use spdl_source::tar_index::py_repr;

use super::npy::Region;

const EOCD: &[u8; 4] = b"PK\x05\x06";
const EOCD_LEN: u64 = 22;
const ZIP64_LOCATOR: &[u8; 4] = b"PK\x06\x07";
const ZIP64_LOCATOR_LEN: u64 = 20;
const ZIP64_EOCD: &[u8; 4] = b"PK\x06\x06";
const ZIP64_EOCD_LEN: u64 = 56;
const CENTRAL: &[u8; 4] = b"PK\x01\x02";
const CENTRAL_LEN: usize = 46;
const LOCAL: &[u8; 4] = b"PK\x03\x04";
const LOCAL_LEN: usize = 30;
const MAX_COMMENT: u64 = 65535;
/// Code page 437's characters for bytes 0x80 to 0xFF (the low half is ASCII).
const CP437_HIGH: &str = "ÇüéâäàåçêëèïîìÄÅÉæÆôöòûùÿÖÜ¢£¥₧ƒáíóúñÑªº¿⌐¬½¼¡«»░▒▓│┤╡╢╖╕╣║╗╝╜╛┐└┴┬├─┼╞╟╚╔╩╦╠═╬╧╨╤╥╙╘╒╓╫╪┘┌█▄▌▐▀αßΓπΣσµτΦΘΩδ∞φε∩≡±≥≤⌠⌡÷≈°∙·√ⁿ²■\u{a0}";

/// Why the directory of an archive cannot be read. The messages are SPDL's where SPDL has one.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ZipError {
    /// Shorter than an end-of-central-directory record.
    #[error(
        "The data is not a valid zip file. (load_npz: {0} bytes, shorter than a zip's end-of-central-directory record)"
    )]
    TooShort(u64),
    /// No end-of-central-directory signature in the last 64 KiB.
    #[error("Failed to locate the end of the central directory. (load_npz: the data is not a valid zip file)")]
    NoEnd,
    /// A malformed record.
    #[error("The data is not a valid zip file. (load_npz: {0})")]
    Invalid(String),
    /// An entry's local header lies outside the archive.
    #[error("load_npz: the local header of entry {} is outside the archive", py_repr(.0.as_bytes()))]
    LocalOutside(String),
    /// An entry's local header has the wrong signature.
    #[error("load_npz: entry {} has a bad local header signature", py_repr(.0.as_bytes()))]
    LocalSignature(String),
    /// An encrypted entry.
    #[error("load_npz: entry {} is encrypted", py_repr(.0.as_bytes()))]
    Encrypted(String),
    /// The data could not be read.
    #[error("{0}")]
    Read(String),
}

/// An entry of the central directory, located.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZipEntry {
    /// The entry's name.
    pub(crate) name: String,
    /// Where its (compressed) data starts.
    pub(crate) offset: u64,
    /// The compressed size.
    pub(crate) compressed: u64,
    /// The uncompressed size.
    pub(crate) uncompressed: u64,
    /// The compression method (0: stored, 8: DEFLATE).
    pub(crate) method: u16,
    /// The CRC-32 of the uncompressed data.
    pub(crate) crc: u32,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(bytes)
}

fn read<'a>(src: &'a (impl Region + ?Sized), offset: u64, len: usize) -> Result<std::borrow::Cow<'a, [u8]>, ZipError> {
    src.read(offset, len).map_err(ZipError::Read)
}

/// The entries of the archive in `src`, in directory order, each payload offset taken from its local header.
pub(crate) fn zip_entries(src: &(impl Region + ?Sized)) -> Result<Vec<ZipEntry>, ZipError> {
    let n = src.len();
    if n < EOCD_LEN {
        return Err(ZipError::TooShort(n));
    }
    let tail_len = n.min(EOCD_LEN + MAX_COMMENT + ZIP64_LOCATOR_LEN + ZIP64_EOCD_LEN);
    let tail_start = n - tail_len;
    let tail = read(src, tail_start, tail_len as usize)?;
    let search_from = tail.len().saturating_sub((EOCD_LEN + MAX_COMMENT) as usize);
    let at = tail[search_from..].windows(4).rposition(|w| w == EOCD).ok_or(ZipError::NoEnd)? + search_from;
    let Some(eocd) = tail.get(at..at + EOCD_LEN as usize) else {
        return Err(ZipError::Invalid("the end-of-central-directory record is truncated".into()));
    };
    let mut cd_size = u64::from(u32_at(eocd, 12));
    let mut cd_offset = u64::from(u32_at(eocd, 16));
    // Where the directory ends: the end record, or the ZIP64 end record that precedes its locator.
    let mut end = tail_start + at as u64;
    let z64 = at.checked_sub((ZIP64_LOCATOR_LEN + ZIP64_EOCD_LEN) as usize);
    if let Some(z) = z64.filter(|&z| tail[z + ZIP64_EOCD_LEN as usize..].starts_with(ZIP64_LOCATOR))
        && tail[z..].starts_with(ZIP64_EOCD)
    {
        cd_size = u64_at(&tail, z + 40);
        cd_offset = u64_at(&tail, z + 48);
        end = tail_start + z as u64;
    }
    let Some(cd_start) = end.checked_sub(cd_size) else {
        return Err(ZipError::Invalid(format!(
            "a central directory of {cd_size} bytes does not fit before its end record"
        )));
    };
    // Bytes before the archive (a self-extracting stub) shift every offset by `concat`.
    let Some(concat) = cd_start.checked_sub(cd_offset) else {
        return Err(ZipError::Invalid(format!("the central directory's offset {cd_offset} is outside the archive")));
    };
    let directory = read(src, cd_start, usize::try_from(cd_size).map_err(|_| ZipError::Invalid("too large".into()))?)?;
    let mut entries = Vec::new();
    let mut pos = 0;
    while pos < directory.len() {
        let Some(header) = directory.get(pos..pos + CENTRAL_LEN) else {
            return Err(ZipError::Invalid("truncated central directory".into()));
        };
        if header[..4] != CENTRAL[..] {
            return Err(ZipError::Invalid("bad magic number for central directory".into()));
        }
        let flags = u16_at(header, 8);
        let method = u16_at(header, 10);
        let crc = u32_at(header, 16);
        let (name_len, extra_len, comment_len) =
            (usize::from(u16_at(header, 28)), usize::from(u16_at(header, 30)), usize::from(u16_at(header, 32)));
        let name_at = pos + CENTRAL_LEN;
        let (Some(raw_name), Some(extra)) = (
            directory.get(name_at..name_at + name_len),
            directory.get(name_at + name_len..name_at + name_len + extra_len),
        ) else {
            return Err(ZipError::Invalid("truncated central directory".into()));
        };
        let name = if flags & 0x800 != 0 {
            std::str::from_utf8(raw_name)
                .map_err(|e| ZipError::Invalid(format!("an entry name is not UTF-8 ({e})")))?
                .to_owned()
        } else {
            raw_name.iter().map(|&b| if b < 0x80 { char::from(b) } else { cp437(b) }).collect()
        };
        let mut sizes = [u64::from(u32_at(header, 24)), u64::from(u32_at(header, 20)), u64::from(u32_at(header, 42))];
        zip64_extra(extra, &mut sizes)?;
        let [uncompressed, compressed, local] = sizes;
        pos = name_at + name_len + extra_len + comment_len;

        let local = local.checked_add(concat).filter(|l| l.checked_add(LOCAL_LEN as u64).is_some_and(|e| e <= n));
        let Some(local) = local else {
            return Err(ZipError::LocalOutside(name));
        };
        let header = read(src, local, LOCAL_LEN)?;
        if header[..4] != LOCAL[..] {
            return Err(ZipError::LocalSignature(name));
        }
        if flags & 0x1 != 0 {
            return Err(ZipError::Encrypted(name));
        }
        let offset = local + LOCAL_LEN as u64 + u64::from(u16_at(&header, 26)) + u64::from(u16_at(&header, 28));
        entries.push(ZipEntry { name, offset, compressed, uncompressed, method, crc });
    }
    Ok(entries)
}

fn cp437(b: u8) -> char {
    CP437_HIGH.chars().nth(usize::from(b - 0x80)).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// Replaces the sizes and offset (`[uncompressed, compressed, local offset]`) that are `0xFFFFFFFF` with the
/// values of the ZIP64 extra field, in that order.
fn zip64_extra(mut extra: &[u8], sizes: &mut [u64; 3]) -> Result<(), ZipError> {
    while extra.len() >= 4 {
        let (id, len) = (u16_at(extra, 0), usize::from(u16_at(extra, 2)));
        let Some(body) = extra.get(4..4 + len) else {
            return Err(ZipError::Invalid("corrupt extra field".into()));
        };
        if id == 1 {
            let mut fields = body.chunks_exact(8);
            for size in sizes.iter_mut().filter(|s| **s == 0xFFFF_FFFF) {
                let field = fields.next().ok_or_else(|| ZipError::Invalid("corrupt ZIP64 extra field".into()))?;
                *size = u64_at(field, 0);
            }
        }
        extra = &extra[4 + len..];
    }
    Ok(())
}

/// Why an entry table is refused (a `ValueError`, as SPDL's `NpzFile` raises).
#[derive(Debug, thiserror::Error)]
pub(crate) enum EntryError {
    /// Not 4 or 5 fields.
    #[error("NPZ entry {} metadata must contain 4 or 5 fields.", py_repr(.0.as_bytes()))]
    Fields(String),
    /// A negative offset or compressed size.
    #[error("NPZ entry {} has a negative payload region.", py_repr(.0.as_bytes()))]
    NegativeRegion(String),
    /// The payload runs past the archive.
    #[error(
        "NPZ entry {} payload is outside the archive buffer (offset {offset}, {compressed} bytes, archive {size} bytes).",
        py_repr(.name.as_bytes())
    )]
    Outside {
        /// The entry.
        name: String,
        /// Its offset.
        offset: i128,
        /// Its compressed size.
        compressed: i128,
        /// The archive's size.
        size: u64,
    },
    /// A negative uncompressed size.
    #[error("NPZ entry {} has a negative uncompressed size.", py_repr(.0.as_bytes()))]
    NegativeSize(String),
    /// A stored entry whose two sizes differ.
    #[error("NPZ stored entry {} must have matching compressed and uncompressed sizes.", py_repr(.0.as_bytes()))]
    StoredSizes(String),
    /// Neither stored nor DEFLATE.
    #[error("NPZ entry {} uses unsupported compression method {method}.", py_repr(.name.as_bytes()))]
    Method {
        /// The entry.
        name: String,
        /// Its method.
        method: i128,
    },
    /// The DEFLATE entries declare more than the budget.
    #[error("NPZ deflated entries exceed max_uncompressed_bytes ({0}).")]
    Budget(u64),
}

/// An entry of an NPZ table as given: `(offset, compressed, uncompressed, method[, crc32])`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EntryFields {
    /// The payload offset.
    pub(crate) offset: i128,
    /// The compressed size.
    pub(crate) compressed: i128,
    /// The uncompressed size.
    pub(crate) uncompressed: i128,
    /// The method.
    pub(crate) method: i128,
}

/// Checks one entry against an archive of `size` bytes and adds a DEFLATE entry's size to `total`, which may
/// not pass `budget`. Returns `(offset, compressed, uncompressed, method)`.
pub(crate) fn check_entry(
    name: &str,
    e: EntryFields,
    size: u64,
    total: &mut u64,
    budget: u64,
) -> Result<(u64, u64, u64, u16), EntryError> {
    if e.offset < 0 || e.compressed < 0 {
        return Err(EntryError::NegativeRegion(name.to_owned()));
    }
    if e.offset > i128::from(size) || e.compressed > i128::from(size) - e.offset {
        return Err(EntryError::Outside { name: name.to_owned(), offset: e.offset, compressed: e.compressed, size });
    }
    if e.uncompressed < 0 {
        return Err(EntryError::NegativeSize(name.to_owned()));
    }
    match e.method {
        0 if e.compressed != e.uncompressed => return Err(EntryError::StoredSizes(name.to_owned())),
        0 => {}
        8 => {
            let room = budget - *total;
            if e.uncompressed > i128::from(room) {
                return Err(EntryError::Budget(budget));
            }
            *total += e.uncompressed as u64;
        }
        method => return Err(EntryError::Method { name: name.to_owned(), method }),
    }
    Ok((e.offset as u64, e.compressed as u64, e.uncompressed as u64, e.method as u16))
}

/// Why an entry does not inflate to its declared size.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InflateError {
    /// Not DEFLATE data, or the stream ends early.
    #[error("NPZ entry {}: failed to decompress the data ({why})", py_repr(.name.as_bytes()))]
    Corrupt {
        /// The entry.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// More than the declared size comes out.
    #[error("NPZ entry {} inflates to more than its declared {size} bytes", py_repr(.name.as_bytes()))]
    TooLarge {
        /// The entry.
        name: String,
        /// Its declared size.
        size: u64,
    },
    /// Less than the declared size comes out.
    #[error("NPZ entry {}: failed to decompress the data (it inflates to {got} bytes, {size} declared)", py_repr(.name.as_bytes()))]
    Short {
        /// The entry.
        name: String,
        /// What came out.
        got: u64,
        /// Its declared size.
        size: u64,
    },
}

/// Inflates the raw DEFLATE stream `payload` of entry `name` into exactly `size` bytes: at most `size + 1` bytes
/// are allocated, whatever the stream holds.
pub(crate) fn inflate(name: &str, payload: &[u8], size: u64) -> Result<Vec<u8>, InflateError> {
    let corrupt = |why: String| InflateError::Corrupt { name: name.to_owned(), why };
    let cap = usize::try_from(size).ok().and_then(|s| s.checked_add(1)).ok_or_else(|| corrupt("too large".into()))?;
    let mut out = Vec::new();
    out.try_reserve_exact(cap).map_err(|e| corrupt(format!("cannot allocate {size} bytes: {e}")))?;
    out.resize(cap, 0);
    let mut state = Box::<DecompressorOxide>::default();
    let (status, _, written) =
        decompress(&mut state, payload, &mut out, 0, inflate_flags::TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF);
    let written = written as u64;
    if written > size || status == TINFLStatus::HasMoreOutput {
        return Err(InflateError::TooLarge { name: name.to_owned(), size });
    }
    match status {
        TINFLStatus::Done if written == size => {
            out.truncate(cap - 1);
            Ok(out)
        }
        TINFLStatus::Done => Err(InflateError::Short { name: name.to_owned(), got: written, size }),
        TINFLStatus::NeedsMoreInput | TINFLStatus::FailedCannotMakeProgress => {
            Err(corrupt(format!("the stream ends after {written} of {size} bytes")))
        }
        other => Err(corrupt(format!("invalid DEFLATE data: {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored-entry archive of `(name, data)`, as `zipfile` writes one.
    fn archive(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut central = Vec::new();
        for (name, data) in files {
            let local = out.len() as u32;
            let fixed = |sig: &[u8], extra: &[u8]| {
                let mut h = sig.to_vec();
                h.extend(extra);
                h.extend([0, 0, 0, 0, 0, 0, 0, 0]); // flags, method, time, date
                h.extend([0u8; 4]); // crc
                h.extend((data.len() as u32).to_le_bytes());
                h.extend((data.len() as u32).to_le_bytes());
                h.extend((name.len() as u16).to_le_bytes());
                h.extend([0, 0]); // extra length
                h
            };
            out.extend(fixed(LOCAL, &[20, 0]));
            out.extend(name.as_bytes());
            out.extend(*data);
            central.extend(fixed(CENTRAL, &[20, 0, 20, 0]));
            central.extend([0u8; 10]); // comment length, disk, internal and external attributes
            central.extend(local.to_le_bytes());
            central.extend(name.as_bytes());
        }
        let cd_offset = out.len() as u32;
        out.extend(&central);
        out.extend(EOCD);
        out.extend([0, 0, 0, 0]);
        out.extend((files.len() as u16).to_le_bytes());
        out.extend((files.len() as u16).to_le_bytes());
        out.extend((central.len() as u32).to_le_bytes());
        out.extend(cd_offset.to_le_bytes());
        out.extend([0, 0]);
        out
    }

    #[test]
    fn reads_entries_and_prepended_bytes() {
        let data = archive(&[("a.npy", b"hello"), ("dir/b.npy", b"xy")]);
        let entries = zip_entries(data.as_slice()).expect("valid");
        let names: Vec<_> = entries.iter().map(|e| (e.name.as_str(), e.offset, e.compressed)).collect();
        assert_eq!(names, [("a.npy", 35, 5), ("dir/b.npy", 79, 2)]);
        assert_eq!(&data[35..40], b"hello");
        let shifted = [&b"stub"[..], &data].concat();
        assert_eq!(zip_entries(shifted.as_slice()).expect("valid")[0].offset, 39);
    }

    #[test]
    fn hostile_directories_are_errors() {
        let data = archive(&[("x.npy", b"payload")]);
        let eocd = data.len() - 22;
        let central = data.windows(4).position(|w| w == CENTRAL).expect("central");
        assert!(matches!(zip_entries(&data[..10]), Err(ZipError::TooShort(10))));
        assert!(matches!(zip_entries(&[0u8; 100][..]), Err(ZipError::NoEnd)));
        assert!(matches!(zip_entries(&data[..data.len() - 10]), Err(ZipError::Invalid(_))));
        let patched = |at: usize, v: u32| {
            let mut d = data.clone();
            d[at..at + 4].copy_from_slice(&v.to_le_bytes());
            zip_entries(d.as_slice()).expect_err("hostile").to_string()
        };
        assert!(patched(eocd + 12, 0xFFFF_FFF0).contains("not a valid zip file"));
        assert!(patched(eocd + 16, 0xFFFF_FFF0).contains("outside the archive"));
        assert!(patched(central + 42, 0xFFFF_FFF0).contains("local header of entry 'x.npy' is outside the archive"));
        assert!(patched(0, 0x0909_4B50).contains("bad local header signature"));
        assert!(patched(central + 8, 1).contains("encrypted"));
    }

    #[test]
    fn entry_tables_are_checked() {
        let e = |offset, compressed, uncompressed, method| EntryFields { offset, compressed, uncompressed, method };
        let mut total = 0;
        assert!(check_entry("x", e(4, 10, 10, 0), 20, &mut total, 100).is_ok());
        for (fields, words) in [
            (e(-1, 10, 10, 0), "negative payload region"),
            (e(4, 20, 20, 0), "outside the archive buffer"),
            (e(4, 10, -1, 8), "negative uncompressed size"),
            (e(4, 10, 12, 0), "matching compressed"),
            (e(4, 10, 10, 14), "unsupported compression method 14"),
            (e(4, 10, 1 << 40, 8), "exceed max_uncompressed_bytes (100)"),
        ] {
            let err = check_entry("x", fields, 20, &mut total, 100).expect_err(words).to_string();
            assert!(err.contains(words), "{err}");
        }
        assert!(check_entry("x", e(4, 10, 60, 8), 20, &mut total, 100).is_ok());
        assert!(check_entry("y", e(4, 10, 60, 8), 20, &mut total, 100).is_err()); // 120 in all
    }

    #[test]
    fn inflate_stops_at_the_declared_size() {
        // A stored DEFLATE block of "abcd" (final, 4 bytes).
        let stream = [1u8, 4, 0, 0xFB, 0xFF, b'a', b'b', b'c', b'd'];
        assert_eq!(inflate("x", &stream, 4).expect("exact"), b"abcd");
        assert!(matches!(inflate("x", &stream, 3), Err(InflateError::TooLarge { size: 3, .. })));
        assert!(matches!(inflate("x", &stream, 0), Err(InflateError::TooLarge { size: 0, .. })));
        assert!(matches!(inflate("x", &stream, 9), Err(InflateError::Short { got: 4, size: 9, .. })));
        assert!(matches!(inflate("x", &stream[..6], 4), Err(InflateError::Corrupt { .. })));
        assert!(matches!(inflate("x", &[0xFF; 8], 4), Err(InflateError::Corrupt { .. })));
        assert!(inflate("x", &stream, u64::MAX).is_err());
    }
}
