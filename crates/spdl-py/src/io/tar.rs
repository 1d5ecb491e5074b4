//! `spdl_rs.io.iter_tarfile`'s native half: spdl-source's TAR member index for archives in memory
//! ([`tar_index`], one call, the GIL released while scanning) and a streaming reader over a file-like object's
//! `read()` ([`TarStream`]) that parses headers with the same [`TarParser`].

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString, PyTuple, PyType};
use spdl_source::tar_index::{BLOCK, HeaderStep, MemberData, TarFormatError, TarParser, index, is_zero, py_repr};

/// A file-like source is read at most this much at a time, so a header that declares a huge size on a short
/// stream fails when the stream ends instead of allocating the declared size.
const READ_CHUNK: u64 = 16 << 20;
/// Members up to this size are read together with their padding, in one `read()`.
const SMALL_MEMBER: u64 = 1 << 16;

/// A member path as Python sees it: `bytes.decode("utf-8", "surrogateescape")`.
fn path_str<'py>(py: Python<'py>, name: &[u8]) -> PyResult<Bound<'py, PyString>> {
    if let Ok(text) = std::str::from_utf8(name) {
        return Ok(PyString::new(py, text));
    }
    let len = isize::try_from(name.len()).map_err(|_| PyValueError::new_err("TAR member path too long"))?;
    // SAFETY: `name` is valid for `len` bytes and the error handler is a NUL-terminated C string; the result is a
    // new reference or NULL with an exception set, which `from_owned_ptr_or_err` turns into `Err`.
    unsafe {
        let obj = pyo3::ffi::PyUnicode_DecodeUTF8(name.as_ptr().cast(), len, c"surrogateescape".as_ptr());
        Ok(Bound::from_owned_ptr_or_err(py, obj)?.cast_into::<PyString>()?)
    }
}

/// Runs `f` over the bytes of `data`: a `bytes` object or any C-contiguous buffer, without copying (the GIL
/// released) where the interpreter's ABI allows it.
fn with_buffer<R: Send>(data: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> R + Send) -> PyResult<R> {
    let py = data.py();
    if let Ok(bytes) = data.cast::<PyBytes>() {
        // `bytes` is immutable and `data` keeps it alive while the GIL is released.
        let slice = bytes.as_bytes();
        return Ok(crate::lifecycle::detach(py, || f(slice)));
    }
    #[cfg(any(not(Py_LIMITED_API), Py_3_11))]
    {
        let buffer = pyo3::buffer::PyBuffer::<u8>::get(data)?;
        if !buffer.is_c_contiguous() {
            return Err(PyValueError::new_err("iter_tarfile: the data must be a C-contiguous buffer"));
        }
        let len = buffer.len_bytes();
        let ptr = buffer.buf_ptr().cast::<u8>().cast_const();
        let slice: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: the exported buffer (held by `buffer` until the end of this block) is `len` contiguous bytes
            // at `ptr`; an exporter cannot resize or free it while the export is held.
            unsafe { std::slice::from_raw_parts(ptr, len) }
        };
        if buffer.readonly() {
            Ok(crate::lifecycle::detach(py, || f(slice)))
        } else {
            // A writable buffer may be written by other Python threads: scan it with the GIL held.
            Ok(f(slice))
        }
    }
    #[cfg(all(Py_LIMITED_API, not(Py_3_11)))]
    {
        // The stable ABI of Python 3.10 has no buffer protocol: scan a copy (`bytes(data)`).
        let copy = if let Ok(array) = data.cast::<PyByteArray>() {
            PyBytes::new(py, &array.to_vec())
        } else {
            py.get_type::<PyBytes>().call1((data,))?.cast_into::<PyBytes>()?
        };
        let slice = copy.as_bytes();
        Ok(crate::lifecycle::detach(py, || f(slice)))
    }
}

/// `tar_index(data) -> (members, error)`: the regular members of the TAR archive `data` (bytes or a C-contiguous
/// byte buffer) as `(path, offset, size)` triples (the data of each is `data[offset:offset + size]`), in archive
/// order, and the message of the error that ended the scan early (`None` if the archive is well-formed; the
/// members before the fault are listed).
#[pyfunction]
pub(crate) fn tar_index<'py>(data: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyList>, Option<String>)> {
    let py = data.py();
    let scanned = with_buffer(data, index)?;
    let list = PyList::empty(py);
    for member in &scanned.members {
        let item = PyTuple::new(
            py,
            [
                path_str(py, &member.name)?.into_any(),
                member.offset.into_pyobject(py)?.into_any(),
                member.size.into_pyobject(py)?.into_any(),
            ],
        )?;
        list.append(item)?;
    }
    Ok((list, scanned.error.map(|e| e.to_string())))
}

/// Iterator over the regular members of a TAR stream: `(path, bytes)` pairs, reading the file-like object's
/// `read()` header by header and member by member (never past the member it yields, except at the end-of-archive
/// marker). Errors are raised as instances of the class given at construction.
#[pyclass(module = "spdl_rs._native.io", name = "TarStream")]
pub struct TarStream {
    /// The file-like object's bound `read` method (looked up once).
    read: Py<PyAny>,
    error_type: Py<PyType>,
    parser: TarParser,
    offset: u64,
    done: bool,
}

impl std::fmt::Debug for TarStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TarStream").field("offset", &self.offset).field("done", &self.done).finish_non_exhaustive()
    }
}

impl TarStream {
    fn format_error(&self, py: Python<'_>, message: String) -> PyErr {
        PyErr::from_type(self.error_type.bind(py).clone(), message)
    }

    fn parse_error(&self, py: Python<'_>, error: TarFormatError) -> PyErr {
        self.format_error(py, error.to_string())
    }

    /// One `read(n)` call, as `bytes` (a `bytearray` is copied).
    fn read<'py>(&self, py: Python<'py>, n: u64) -> PyResult<Bound<'py, PyBytes>> {
        let chunk = self.read.bind(py).call1((n,))?;
        if let Ok(bytes) = chunk.cast::<PyBytes>() {
            return Ok(bytes.clone());
        }
        if let Ok(array) = chunk.cast::<PyByteArray>() {
            return Ok(PyBytes::new(py, &array.to_vec()));
        }
        let kind = chunk.get_type().name()?;
        Err(PyTypeError::new_err(format!("iter_tarfile: read() must return bytes, got {kind}")))
    }

    /// `size` bytes from the stream, read at most [`READ_CHUNK`] at a time. `member`: whose data it is (for the
    /// error), `None` for a header. Fewer bytes are returned only at the end of the stream, and then only if
    /// `allow_short` (or `allow_empty` and none at all).
    fn read_exact<'py>(
        &mut self,
        py: Python<'py>,
        size: u64,
        member: Option<&[u8]>,
        allow_empty: bool,
        allow_short: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        if size == 0 {
            return Ok(PyBytes::new(py, b""));
        }
        let mut chunk = self.read(py, size.min(READ_CHUNK))?;
        if chunk.as_bytes().len() as u64 == size {
            self.offset += size;
            return Ok(chunk);
        }
        let mut chunks = Vec::new();
        let mut got = 0u64;
        loop {
            let len = chunk.as_bytes().len() as u64;
            if len == 0 {
                break;
            }
            if got + len > size {
                return Err(self.format_error(
                    py,
                    format!("TAR stream: read() returned {} bytes, more than the {} requested", len, size - got),
                ));
            }
            got += len;
            chunks.push(chunk);
            if got >= size {
                break;
            }
            chunk = self.read(py, (size - got).min(READ_CHUNK))?;
        }
        self.offset += got;
        if got < size && !(allow_short || (allow_empty && got == 0)) {
            let what = member.map_or_else(|| "a header".to_owned(), |name| format!("member {}", py_repr(name)));
            return Err(self.format_error(
                py,
                format!(
                    "TAR archive is truncated: {what} needs {size} bytes at offset {}, the stream ended after {got}",
                    self.offset - got
                ),
            ));
        }
        if chunks.len() == 1 {
            return Ok(chunks.swap_remove(0));
        }
        // `got` bytes did arrive, so this allocation is bounded by the stream, not by a declared size.
        PyBytes::new_with(py, got as usize, |out| {
            let mut at = 0;
            for chunk in &chunks {
                let bytes = chunk.as_bytes();
                out[at..at + bytes.len()].copy_from_slice(bytes);
                at += bytes.len();
            }
            Ok(())
        })
    }

    /// The next header block, `None` at the end of the stream (on a block boundary).
    fn block(&mut self, py: Python<'_>) -> PyResult<Option<[u8; BLOCK]>> {
        let data = self.read_exact(py, BLOCK as u64, None, true, false)?;
        let bytes = data.as_bytes();
        if bytes.is_empty() {
            return Ok(None);
        }
        let mut block = [0u8; BLOCK];
        block.copy_from_slice(bytes);
        Ok(Some(block))
    }

    /// `size` bytes of member data, then the padding to the next block boundary (which may be missing at the
    /// very end of the stream).
    fn data<'py>(&mut self, py: Python<'py>, size: u64, member: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let padded = size.div_ceil(BLOCK as u64) * BLOCK as u64;
        if size > 0 && size <= SMALL_MEMBER && padded > size {
            // One read for the data and its padding; the copy of the data costs less than a second call.
            let data = self.read_exact(py, padded, Some(member), false, true)?;
            let got = data.as_bytes().len() as u64;
            if got < size {
                return Err(self.format_error(
                    py,
                    format!(
                        "TAR archive is truncated: member {} needs {size} bytes at offset {}, the stream ended after \
                         {got}",
                        py_repr(member),
                        self.offset - got
                    ),
                ));
            }
            return Ok(PyBytes::new(py, &data.as_bytes()[..size as usize]));
        }
        let data = self.read_exact(py, size, Some(member), false, false)?;
        self.read_exact(py, padded - size, Some(member), false, true)?;
        Ok(data)
    }

    fn next_member<'py>(&mut self, py: Python<'py>) -> PyResult<Option<(Bound<'py, PyString>, Bound<'py, PyBytes>)>> {
        loop {
            let mut header_offset = self.offset;
            let Some(mut block) = self.block(py)? else {
                if self.parser.pending() {
                    return Err(self.parse_error(py, TarFormatError::DanglingExtendedHeader));
                }
                return Ok(None);
            };
            if is_zero(&block) {
                // One zero block may be padding; two in a row end the archive.
                header_offset = self.offset;
                match self.block(py)? {
                    Some(next) if !is_zero(&next) => block = next,
                    _ => return Ok(None),
                }
            }
            let step = self.parser.header(&block, header_offset).map_err(|e| self.parse_error(py, e))?;
            match step {
                HeaderStep::Meta { kind, size } => {
                    let data = self.data(py, size, kind.describe().as_bytes())?;
                    self.parser.metadata(kind, data.as_bytes(), header_offset).map_err(|e| self.parse_error(py, e))?;
                }
                HeaderStep::Member { name, size, data } => match data {
                    MemberData::Regular => {
                        let contents = self.data(py, size, &name)?;
                        return Ok(Some((path_str(py, &name)?, contents)));
                    }
                    MemberData::Skipped => {
                        self.data(py, size, &name)?;
                    }
                    MemberData::NoData => {}
                },
            }
        }
    }
}

#[pymethods]
impl TarStream {
    /// `TarStream(file, error_type)`: reads `file.read(n)`; raises `error_type(message)` on a malformed archive.
    #[new]
    fn new(file: &Bound<'_, PyAny>, error_type: Py<PyType>) -> PyResult<Self> {
        let read = file.getattr(pyo3::intern!(file.py(), "read"))?.unbind();
        Ok(TarStream { read, error_type, parser: TarParser::new(), offset: 0, done: false })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<(Bound<'py, PyString>, Bound<'py, PyBytes>)>> {
        if self.done {
            return Ok(None);
        }
        let next = self.next_member(py);
        if !matches!(next, Ok(Some(_))) {
            // Like a generator: after the end or an error, the iterator stays exhausted.
            self.done = true;
        }
        next
    }
}
