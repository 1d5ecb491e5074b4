//! `spdl_rs.io`'s NPY and NPZ readers, native half: the NPY header ([`npy_header`]), the ZIP directory of an
//! `.npz` archive ([`zip_directory`]), the check of an `NpzFile` entry table ([`npz_entries`]) and DEFLATE
//! ([`npz_inflate`]). Python keeps what needs NumPy: the dtype made from the checked description, and the
//! array viewing the caller's buffer at the checked offset.
//!
//! The data is read by range ([`PyRegion`]): a `bytes` object in place, any other buffer (a flat byte
//! `memoryview`) one slice at a time, so that a header check reads the header, not the archive. Format errors
//! are `spdl_rs.io.FormatError` (a `ValueError` and a `RuntimeError`, as SPDL raises); errors in an entry table
//! given by the caller are `ValueError`.

use std::borrow::Cow;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PySlice, PyTuple, PyType};

use super::literal::Literal;
use super::npy::{Region, parse_npy};
use super::zip::{EntryError, EntryFields, check_entry, inflate, zip_entries};

/// Bytes of a Python object, read by range: a `bytes` object in place, else a flat byte `memoryview`, whose
/// slices are copied (the stable ABI of Python 3.10 has no buffer protocol).
pub(crate) enum PyRegion<'py> {
    /// A `bytes` object, read in place.
    Bytes(Bound<'py, PyBytes>),
    /// A one-dimensional byte view and its length.
    View(Bound<'py, PyAny>, u64),
}

impl std::fmt::Debug for PyRegion<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PyRegion({} bytes)", Region::len(self))
    }
}

impl<'py> PyRegion<'py> {
    /// `data`: `bytes`, or a one-dimensional `memoryview` of bytes.
    pub(crate) fn new(data: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(bytes) = data.cast::<PyBytes>() {
            return Ok(Self::Bytes(bytes.clone()));
        }
        Ok(Self::View(data.clone(), data.len()? as u64))
    }

    /// All of the bytes: in place for `bytes`, else one copy.
    pub(crate) fn whole(&self) -> PyResult<Cow<'_, [u8]>> {
        match self {
            Self::Bytes(b) => Ok(Cow::Borrowed(b.as_bytes())),
            Self::View(view, _) => {
                Ok(Cow::Owned(view.call_method0("tobytes")?.cast_into::<PyBytes>()?.as_bytes().to_vec()))
            }
        }
    }
}

impl Region for PyRegion<'_> {
    fn len(&self) -> u64 {
        match self {
            Self::Bytes(b) => b.as_bytes().len() as u64,
            Self::View(_, n) => *n,
        }
    }

    fn read(&self, offset: u64, len: usize) -> Result<Cow<'_, [u8]>, String> {
        let end = offset.checked_add(len as u64).filter(|&end| end <= Region::len(self));
        let Some(end) = end else {
            return Err(format!("{len} bytes at offset {offset} are outside the {} bytes", Region::len(self)));
        };
        match self {
            Self::Bytes(b) => Ok(Cow::Borrowed(&b.as_bytes()[offset as usize..end as usize])),
            Self::View(view, _) => {
                let py = view.py();
                let part = (|| {
                    let slice = PySlice::new(py, offset as isize, end as isize, 1);
                    view.get_item(slice)?.call_method0("tobytes")?.cast_into::<PyBytes>().map_err(PyErr::from)
                })()
                .map_err(|e| e.to_string())?;
                Ok(Cow::Owned(part.as_bytes().to_vec()))
            }
        }
    }
}

/// A format error: `spdl_rs.io.FormatError` (a `ValueError` where that class cannot be imported).
pub(crate) fn format_error(py: Python<'_>, message: String) -> PyErr {
    static FORMAT_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    match FORMAT_ERROR.import(py, "spdl_rs.io._tar", "FormatError") {
        Ok(class) => PyErr::from_type(class.clone(), message),
        Err(_) => PyValueError::new_err(message),
    }
}

/// A literal as the Python object `ast.literal_eval` gives.
fn literal_to_py<'py>(py: Python<'py>, value: &Literal) -> PyResult<Bound<'py, PyAny>> {
    let items = |items: &[Literal]| items.iter().map(|v| literal_to_py(py, v)).collect::<PyResult<Vec<_>>>();
    Ok(match value {
        Literal::Str(s) => s.into_pyobject(py)?.into_any(),
        Literal::Int(i) => i.into_pyobject(py)?.into_any(),
        Literal::Float(s) => s.replace('_', "").parse::<f64>().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        Literal::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Literal::None => py.None().into_bound(py),
        Literal::Tuple(t) => PyTuple::new(py, items(t)?)?.into_any(),
        Literal::List(l) => PyList::new(py, items(l)?)?.into_any(),
        Literal::Dict(d) => {
            let dict = PyDict::new(py);
            for (k, v) in d {
                dict.set_item(literal_to_py(py, k)?, literal_to_py(py, v)?)?;
            }
            dict.into_any()
        }
    })
}

/// `npy_header(data, what) -> (descr, shape, fortran_order, offset)`: the checked header of the NPY data in
/// `data` (`bytes` or a flat byte `memoryview`). `descr` is a type string or a structured dtype's list of fields
/// (never an object dtype); `data` holds the payload the shape needs from `offset` on. Raises `FormatError`,
/// its message prefixed with `what`.
#[pyfunction]
pub(crate) fn npy_header<'py>(
    data: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>, bool, u64)> {
    let py = data.py();
    let header = parse_npy(&PyRegion::new(data)?).map_err(|e| format_error(py, format!("{what}: {e}")))?;
    let descr = literal_to_py(py, &header.descr)?;
    Ok((descr, PyTuple::new(py, &header.shape)?, header.fortran_order, header.offset))
}

/// `zip_directory(data) -> {name: (offset, compressed, uncompressed, method, crc32)}`: the entries of the ZIP
/// archive in `data` (`bytes` or a flat byte `memoryview`), each offset that of its payload. Raises
/// `FormatError`.
#[pyfunction]
pub(crate) fn zip_directory<'py>(data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let py = data.py();
    let entries = zip_entries(&PyRegion::new(data)?).map_err(|e| format_error(py, e.to_string()))?;
    let dict = PyDict::new(py);
    for e in entries {
        dict.set_item(e.name, (e.offset, e.compressed, e.uncompressed, e.method, e.crc))?;
    }
    Ok(dict)
}

/// `npz_entries(size, meta, max_uncompressed_bytes) -> {name: (offset, compressed, uncompressed, method, crc32 or
/// None)}`: `NpzFile`'s entry table checked against an archive of `size` bytes: every payload inside it, stored
/// entries with equal sizes, DEFLATE entries declaring at most `max_uncompressed_bytes` together. Raises
/// `ValueError`.
#[pyfunction]
pub(crate) fn npz_entries<'py>(
    size: u64,
    meta: &Bound<'py, PyAny>,
    max_uncompressed_bytes: i128,
) -> PyResult<Bound<'py, PyDict>> {
    let py = meta.py();
    let budget = u64::try_from(max_uncompressed_bytes)
        .map_err(|_| PyValueError::new_err("max_uncompressed_bytes must be non-negative."))?;
    let checked = PyDict::new(py);
    let mut total = 0;
    for item in meta.call_method0("items")?.try_iter()? {
        let (name, entry): (String, Bound<'py, PyAny>) = item?.extract()?;
        let len = entry.len()?;
        if len != 4 && len != 5 {
            return Err(PyValueError::new_err(EntryError::Fields(name).to_string()));
        }
        let int = |i: usize| -> PyResult<i128> { entry.get_item(i)?.call_method0("__index__")?.extract() };
        let fields = EntryFields { offset: int(0)?, compressed: int(1)?, uncompressed: int(2)?, method: int(3)? };
        let crc: Option<i128> = if len == 5 { entry.get_item(4)?.extract()? } else { None };
        let (offset, compressed, uncompressed, method) =
            check_entry(&name, fields, size, &mut total, budget).map_err(|e| PyValueError::new_err(e.to_string()))?;
        checked.set_item(name, (offset, compressed, uncompressed, method, crc))?;
    }
    Ok(checked)
}

/// `npz_inflate(payload, name, size) -> bytearray`: the raw DEFLATE data `payload` (`bytes` or a flat byte
/// `memoryview`) of entry `name`, inflated without the GIL into exactly `size` bytes (no more is allocated).
/// Raises `FormatError` when the data is not DEFLATE or inflates to another size.
#[pyfunction]
pub(crate) fn npz_inflate<'py>(
    payload: &Bound<'py, PyAny>,
    name: &str,
    size: u64,
) -> PyResult<Bound<'py, PyByteArray>> {
    let py = payload.py();
    let region = PyRegion::new(payload)?;
    let compressed = region.whole()?;
    let compressed: &[u8] = &compressed;
    let inflated = crate::lifecycle::detach(py, || inflate(name, compressed, size));
    let inflated = inflated.map_err(|e| format_error(py, e.to_string()))?;
    Ok(PyByteArray::new(py, &inflated))
}
