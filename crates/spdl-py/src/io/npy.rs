//! NumPy's NPY format, read without NumPy: the magic string, the version, the header length and the header
//! dict (`descr`, `fortran_order`, `shape`), every size checked against the data before anything is read or
//! allocated. The dict is a Python literal, read by a small parser of the literals NumPy writes (strings,
//! integers, floats, `True`/`False`/`None`, tuples, lists, dicts) with a nesting bound: nothing is evaluated.
//! The item size of the dtype comes from its type string (`'<f4'`) or, for a structured dtype, from its list
//! of fields (NumPy writes them packed, with `('', '|V<n>')` padding entries), so the payload size is checked
//! here too; NumPy builds the dtype itself from the `descr` this module hands back.

use std::borrow::Cow;

use super::literal::{Literal, LiteralError, Parser};

impl From<LiteralError> for NpyError {
    fn from(e: LiteralError) -> Self {
        Self::Syntax(e.0)
    }
}

/// Bytes read by range: a Python buffer, or a slice in tests. Every read is bounds-checked by the caller
/// against [`Region::len`], and again by the implementation.
pub(crate) trait Region {
    /// The number of bytes.
    fn len(&self) -> u64;
    /// `len` bytes from `offset`, or why they cannot be read.
    fn read(&self, offset: u64, len: usize) -> Result<Cow<'_, [u8]>, String>;
}

impl Region for [u8] {
    fn len(&self) -> u64 {
        self.len() as u64
    }

    fn read(&self, offset: u64, len: usize) -> Result<Cow<'_, [u8]>, String> {
        usize::try_from(offset)
            .ok()
            .and_then(|start| self.get(start..start.checked_add(len)?))
            .map(Cow::Borrowed)
            .ok_or_else(|| format!("{len} bytes at offset {offset} are outside the {} bytes", self.len()))
    }
}

/// The NPY magic string.
pub(crate) const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// The longest header read. NumPy writes ~120 bytes; a wide structured dtype a few KiB.
pub(crate) const MAX_HEADER_BYTES: u64 = 1 << 20;

/// Why NPY data cannot be read. The messages name the cause; the caller prefixes the input's name.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NpyError {
    /// Shorter than the magic string and version.
    #[error("failed to parse the magic prefix (data too short: {0} bytes)")]
    TooShort(u64),
    /// Not NPY data.
    #[error("the data must start with the prefix '\\x93NUMPY' (not NPY data)")]
    BadMagic,
    /// A version other than 1.0, 2.0 or 3.0.
    #[error("unsupported NPY format version {0}.{1}")]
    Version(u8, u8),
    /// The data ends inside the header length field.
    #[error("failed to parse header (data too short for its length field)")]
    NoLength,
    /// The header is longer than the data.
    #[error("failed to parse header: it declares {declared} bytes, {present} are present (truncated)")]
    Truncated {
        /// The declared header length.
        declared: u64,
        /// The bytes after the length field.
        present: u64,
    },
    /// The header is longer than [`MAX_HEADER_BYTES`].
    #[error("failed to parse header: {0} bytes (more than {MAX_HEADER_BYTES})")]
    HeaderTooLong(u64),
    /// The header is not a Python literal of the kinds NumPy writes.
    #[error("failed to parse header ({0})")]
    Syntax(String),
    /// The header is a literal, but not the dict of the three keys.
    #[error("failed to parse header: expected a dict with keys descr, fortran_order and shape, got {0:.200}")]
    NotHeaderDict(String),
    /// `shape` is not a tuple of integers (or a dimension is larger than NumPy takes).
    #[error("invalid shape in header: {0:.200}")]
    Shape(String),
    /// A dimension is negative.
    #[error("negative dimension in header shape {0:.200}")]
    NegativeDimension(String),
    /// `fortran_order` is not a boolean.
    #[error("invalid fortran_order in header: {0:.100}")]
    FortranOrder(String),
    /// `descr` is not a dtype description.
    #[error("invalid dtype in header: {descr:.200} ({why})")]
    Dtype {
        /// The description, as Python's `repr`.
        descr: String,
        /// What is wrong with it.
        why: String,
    },
    /// An object dtype: its payload is a pickle.
    #[error("object NPY dtypes are not supported (the payload is a pickle, which is never loaded)")]
    Object,
    /// The payload is shorter than the shape and dtype need.
    #[error(
        "NPY payload is shorter than its declared shape: shape {shape} of {descr} needs {needed} bytes, {present} are present"
    )]
    Payload {
        /// The shape, as a Python tuple.
        shape: String,
        /// The dtype description.
        descr: String,
        /// The bytes the shape needs (a decimal number, or more than `u128` holds).
        needed: String,
        /// The bytes after the header.
        present: u64,
    },
    /// The data could not be read.
    #[error("{0}")]
    Read(String),
}

/// A checked NPY header.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NpyHeader {
    /// The dtype description: a type string ([`Literal::Str`]) or a list of fields ([`Literal::List`]).
    pub(crate) descr: Literal,
    /// The shape.
    pub(crate) shape: Vec<u64>,
    /// Whether the payload is column-major.
    pub(crate) fortran_order: bool,
    /// Where the payload starts.
    pub(crate) offset: u64,
}

/// Reads and checks the NPY header of `src`: after it, `src` holds at least the payload its shape and dtype
/// need, from [`NpyHeader::offset`].
pub(crate) fn parse_npy(src: &(impl Region + ?Sized)) -> Result<NpyHeader, NpyError> {
    let n = src.len();
    if n < 8 {
        return Err(NpyError::TooShort(n));
    }
    let prefix = src.read(0, n.min(12) as usize).map_err(NpyError::Read)?;
    if prefix[..6] != MAGIC[..] {
        return Err(NpyError::BadMagic);
    }
    let (len_bytes, utf8) = match prefix[6] {
        1 => (2, false),
        2 => (4, false),
        3 => (4, true),
        major => return Err(NpyError::Version(major, prefix[7])),
    };
    let start = 8 + len_bytes;
    if n < start {
        return Err(NpyError::NoLength);
    }
    let header_len = if len_bytes == 2 {
        u64::from(u16::from_le_bytes([prefix[8], prefix[9]]))
    } else {
        u64::from(u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]))
    };
    if header_len > n - start {
        return Err(NpyError::Truncated { declared: header_len, present: n - start });
    }
    if header_len > MAX_HEADER_BYTES {
        return Err(NpyError::HeaderTooLong(header_len));
    }
    let raw = src.read(start, header_len as usize).map_err(NpyError::Read)?;
    let text: Cow<'_, str> = if utf8 {
        Cow::Borrowed(std::str::from_utf8(&raw).map_err(|e| NpyError::Syntax(format!("UnicodeDecodeError: {e}")))?)
    } else {
        Cow::Owned(raw.iter().map(|&b| char::from(b)).collect())
    };
    let (descr, shape, fortran_order) = header_fields(&text)?;
    let itemsize = descr_size(&descr)?;
    let offset = start + header_len;
    let present = n - offset;
    let needed = shape.iter().try_fold(u128::from(itemsize), |acc, &d| acc.checked_mul(u128::from(d)));
    if needed.is_none_or(|needed| needed > u128::from(present)) {
        return Err(NpyError::Payload {
            shape: Literal::Tuple(shape.iter().map(|&d| Literal::Int(i128::from(d))).collect()).to_string(),
            descr: match &descr {
                Literal::Str(s) => s.clone(),
                other => other.to_string(),
            },
            needed: needed.map_or_else(|| format!("more than {}", u128::MAX), |b| b.to_string()),
            present,
        });
    }
    Ok(NpyHeader { descr, shape, fortran_order, offset })
}

/// `(descr, shape, fortran_order)` of the header text, each checked.
fn header_fields(text: &str) -> Result<(Literal, Vec<u64>, bool), NpyError> {
    let header = Parser::new(text).document()?;
    let fields = match &header {
        Literal::Dict(items) => {
            let mut fields: [Option<&Literal>; 3] = [None; 3];
            for (key, value) in items {
                let slot = match key {
                    Literal::Str(k) if k == "descr" => 0,
                    Literal::Str(k) if k == "fortran_order" => 1,
                    Literal::Str(k) if k == "shape" => 2,
                    _ => return Err(NpyError::NotHeaderDict(header.to_string())),
                };
                fields[slot] = Some(value); // a repeated key: the last wins, as in a Python dict
            }
            fields
        }
        _ => [None; 3],
    };
    let [Some(descr), Some(fortran), Some(shape)] = fields else {
        return Err(NpyError::NotHeaderDict(header.to_string()));
    };
    let Literal::Tuple(dims) = shape else {
        return Err(NpyError::Shape(shape.to_string()));
    };
    let mut checked = Vec::with_capacity(dims.len());
    for dim in dims {
        match dim {
            Literal::Int(d) if *d < 0 => return Err(NpyError::NegativeDimension(shape.to_string())),
            // NumPy's dimensions are `intp`.
            Literal::Int(d) if *d <= i128::from(i64::MAX) => checked.push(*d as u64),
            _ => return Err(NpyError::Shape(shape.to_string())),
        }
    }
    let Literal::Bool(fortran) = fortran else {
        return Err(NpyError::FortranOrder(fortran.to_string()));
    };
    Ok((descr.clone(), checked, *fortran))
}

/// Why a dtype description is refused.
enum DescrFault {
    Object,
    Invalid(String),
}

/// The item size of a dtype description; an object dtype anywhere in it is [`NpyError::Object`].
pub(crate) fn descr_size(descr: &Literal) -> Result<u64, NpyError> {
    item_size(descr).map_err(|fault| match fault {
        DescrFault::Object => NpyError::Object,
        DescrFault::Invalid(why) => NpyError::Dtype { descr: descr.to_string(), why },
    })
}

fn item_size(descr: &Literal) -> Result<u64, DescrFault> {
    match descr {
        Literal::Str(s) => typestr_size(s),
        Literal::List(fields) => fields.iter().try_fold(0u64, |total, field| {
            total.checked_add(field_size(field)?).ok_or_else(|| DescrFault::Invalid("too large".into()))
        }),
        _ => Err(DescrFault::Invalid("a dtype is a type string or a list of fields".into())),
    }
}

/// The size of a structured dtype's field: `(name, format)` or `(name, format, shape)`.
fn field_size(field: &Literal) -> Result<u64, DescrFault> {
    let invalid = |why: &str| DescrFault::Invalid(why.to_owned());
    let Literal::Tuple(parts) = field else {
        return Err(invalid("a field is a (name, format[, shape]) tuple"));
    };
    let (name, format, shape) = match parts.as_slice() {
        [name, format] => (name, format, None),
        [name, format, shape] => (name, format, Some(shape)),
        _ => return Err(invalid("a field is a (name, format[, shape]) tuple")),
    };
    match name {
        Literal::Str(_) => {}
        Literal::Tuple(t) if t.len() == 2 && t.iter().all(|p| matches!(p, Literal::Str(_))) => {}
        _ => return Err(invalid("a field name is a string or a (title, name) tuple")),
    }
    let size = item_size(format)?;
    let count = match shape {
        None => 1,
        Some(Literal::Int(d)) => dimension(*d)?,
        Some(Literal::Tuple(dims)) => dims.iter().try_fold(1u64, |acc, d| match d {
            Literal::Int(d) => acc.checked_mul(dimension(*d)?).ok_or_else(|| invalid("too large")),
            _ => Err(invalid("a field shape holds integers")),
        })?,
        Some(_) => return Err(invalid("a field shape is a tuple of integers")),
    };
    size.checked_mul(count).ok_or_else(|| invalid("too large"))
}

fn dimension(d: i128) -> Result<u64, DescrFault> {
    u64::try_from(d).map_err(|_| DescrFault::Invalid(format!("a field dimension of {d}")))
}

/// The item size of a NumPy type string: an optional byte order (`<`, `>`, `|`, `=`), a kind, a size, and
/// for datetimes a unit (`'<M8[ns]'`).
fn typestr_size(s: &str) -> Result<u64, DescrFault> {
    let invalid = || DescrFault::Invalid("not a NumPy type string".into());
    let rest = s.strip_prefix(['<', '>', '|', '=']).unwrap_or(s);
    let mut chars = rest.chars();
    let kind = chars.next().ok_or_else(invalid)?;
    let tail = chars.as_str();
    let (digits, unit) = match tail.find('[') {
        Some(i) => (&tail[..i], Some(&tail[i..])),
        None => (tail, None),
    };
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let size: Option<u64> = if digits.is_empty() { None } else { Some(digits.parse().map_err(|_| invalid())?) };
    if let Some(unit) = unit {
        let inner = unit.strip_prefix('[').and_then(|u| u.strip_suffix(']')).ok_or_else(invalid)?;
        if !matches!(kind, 'M' | 'm') || inner.is_empty() || !inner.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(invalid());
        }
    }
    let sized = |allowed: &[u64]| match size {
        Some(n) if allowed.contains(&n) => Ok(n),
        _ => Err(DescrFault::Invalid(format!("no {kind:?} type of {} bytes", digits))),
    };
    match kind {
        'O' => Err(DescrFault::Object),
        '?' | 'b' if size.is_none_or(|n| n == 1) => Ok(1),
        'i' | 'u' => sized(&[1, 2, 4, 8]),
        'f' => sized(&[2, 4, 8, 12, 16]),
        'c' => sized(&[8, 16, 24, 32]),
        'S' | 'a' | 'V' => Ok(size.unwrap_or(0)),
        'U' => size.unwrap_or(0).checked_mul(4).ok_or_else(invalid),
        'M' | 'm' if size.is_none_or(|n| n == 8) => Ok(8),
        _ => Err(invalid()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(header: &str, payload: &[u8]) -> Vec<u8> {
        let mut text = header.as_bytes().to_vec();
        text.push(b'\n');
        let mut out = MAGIC.to_vec();
        out.extend([1, 0]);
        out.extend((text.len() as u16).to_le_bytes());
        out.extend(text);
        out.extend(payload);
        out
    }

    #[test]
    fn reads_numpys_header_and_checks_the_payload() {
        let data = npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", &[0; 24]);
        let h = parse_npy(data.as_slice()).expect("valid");
        assert_eq!((h.descr.clone(), h.shape.clone(), h.fortran_order), (Literal::Str("<f4".into()), vec![2, 3], true));
        assert_eq!(h.offset as usize, data.len() - 24);
        let short = &data[..data.len() - 1];
        let err = parse_npy(short).expect_err("short").to_string();
        assert!(err.contains("shape (2, 3) of <f4 needs 24 bytes, 23 are present"), "{err}");
    }

    #[test]
    fn structured_descrs_are_sized_and_objects_refused() {
        let descr = "[('a', '<i4'), ('', '|V4'), (('t', 'b'), '<f8', (2,)), ('n', [('x', '|u1')], 3)]";
        let data = npy(&format!("{{'descr': {descr}, 'fortran_order': False, 'shape': (1,), }}"), &[0; 27]);
        let h = parse_npy(data.as_slice()).expect("valid");
        assert_eq!(descr_size(&h.descr).expect("sized"), 4 + 4 + 16 + 3);
        assert_eq!(h.descr.to_string(), descr);
        let obj = npy("{'descr': [('a', '<i4'), ('o', '|O')], 'fortran_order': False, 'shape': (1,), }", &[0; 12]);
        assert!(matches!(parse_npy(obj.as_slice()), Err(NpyError::Object)));
    }

    #[test]
    fn hostile_headers_are_errors() {
        assert!(matches!(parse_npy(&b"\x93NUM"[..]), Err(NpyError::TooShort(4))));
        assert!(matches!(parse_npy(&b"XNUMPY\x01\x00\x10\x00"[..]), Err(NpyError::BadMagic)));
        assert!(matches!(parse_npy(&b"\x93NUMPY\x09\x00\x10\x00"[..]), Err(NpyError::Version(9, 0))));
        assert!(matches!(parse_npy(&b"\x93NUMPY\x02\x00\x10"[..]), Err(NpyError::NoLength)));
        let huge = [&b"\x93NUMPY\x02\x00\xff\xff\xff\xff"[..], &[b' '; 100]].concat();
        assert!(matches!(parse_npy(huge.as_slice()), Err(NpyError::Truncated { declared: 4294967295, present: 100 })));
        let long = [&b"\x93NUMPY\x02\x00\x00\x00\x20\x00"[..], &vec![b' '; 2 << 20]].concat();
        assert!(matches!(parse_npy(long.as_slice()), Err(NpyError::HeaderTooLong(2097152))));
        let cases = [
            ("[1, 2, 3]", "expected a dict"),
            ("{'descr': '<i8', 'shape': (3,), }", "expected a dict"),
            ("{'descr': '<i8', 'fortran_order': False, 'shape': (-3,), }", "negative dimension"),
            ("{'descr': '<i8', 'fortran_order': False, 'shape': (3.0,), }", "invalid shape"),
            ("{'descr': '<i8', 'fortran_order': False, 'shape': (99999999999999999999,), }", "invalid shape"),
            ("{'descr': '<i8', 'fortran_order': 'yes', 'shape': (3,), }", "invalid fortran_order"),
            ("{'descr': 'not-a-dtype', 'fortran_order': False, 'shape': (3,), }", "invalid dtype"),
            ("{'descr': '<i3', 'fortran_order': False, 'shape': (3,), }", "invalid dtype"),
            ("{'descr': '<i8', 'fortran_order': False, 'shape': __import__('os'), }", "failed to parse header"),
            ("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), } junk", "failed to parse header"),
            ("{'descr': '<i8", "failed to parse header"),
        ];
        for (header, words) in cases {
            let err = parse_npy(npy(header, &[0; 24]).as_slice()).expect_err(header).to_string();
            assert!(err.contains(words), "{header}: {err}");
        }
        let deep = "{".repeat(500);
        let err = parse_npy(npy(&deep, &[]).as_slice()).expect_err("deep").to_string();
        assert!(err.contains("nested deeper"), "{err}");
        // Eight terabytes declared on 24 bytes; zero-size items need nothing, whatever the shape.
        let big = npy("{'descr': '<i8', 'fortran_order': False, 'shape': (1000000000000,), }", &[0; 24]);
        let err = parse_npy(big.as_slice()).expect_err("big").to_string();
        assert!(err.contains("8000000000000 bytes, 24 are present"), "{err}");
        let overflow = npy(
            "{'descr': '<i8', 'fortran_order': False, 'shape': (4611686018427387904, 4611686018427387904, 99), }",
            &[],
        );
        assert!(matches!(parse_npy(overflow.as_slice()), Err(NpyError::Payload { .. })));
        let empty = npy("{'descr': '|V0', 'fortran_order': False, 'shape': (4611686018427387904,), }", &[]);
        assert_eq!(parse_npy(empty.as_slice()).expect("no bytes needed").shape, vec![4611686018427387904]);
    }

    #[test]
    fn type_strings() {
        for (s, size) in [("<f4", 4), ("|b1", 1), ("<U3", 12), ("|S0", 0), ("<M8[D]", 8), ("<m8[ms]", 8), ("|V24", 24)]
        {
            assert_eq!(typestr_size(s).ok(), Some(size), "{s}");
        }
        for s in ["", "<", "<x4", "<f3", "<i4[D]", "<M8[", "O8"] {
            assert!(typestr_size(s).is_err(), "{s}");
        }
    }
}
