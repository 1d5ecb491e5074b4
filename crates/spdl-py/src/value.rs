//! [`Value`]: what travels between the stages of a Python-built pipeline.
//!
//! Plain data (strings, bytes, integers, floats, buffers, lists of those) travels as Rust values, so a
//! native stage reads it without the GIL; anything else stays a Python object. Values are made from Python
//! objects where the GIL is held anyway (the source's `next()`, a Python op's return) and turned back into
//! Python objects only where Python needs them (a Python op's argument, the consumer's `get_item`).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyFloat, PyInt, PyList, PyString, PyTuple};
use spdl_buffer::Buffer;

use crate::buffer::PyBuffer;

/// One item of a pipeline.
#[derive(Debug)]
pub enum Value {
    /// A Python object that has no Rust form.
    Py(Py<PyAny>),
    /// A `str`.
    Str(String),
    /// A `bytes`.
    Bytes(Vec<u8>),
    /// An `int` that fits in 64 bits.
    Int(i64),
    /// A `float`.
    Float(f64),
    /// An array made by a native op (or a `spdl_rs.Buffer` from Python).
    Buffer(Arc<Buffer>),
    /// A batch (the output of `aggregate`, or a list a Python op returned before `disaggregate`).
    List(Vec<Value>),
}

impl From<Vec<Value>> for Value {
    fn from(v: Vec<Value>) -> Self {
        Value::List(v)
    }
}

impl Value {
    /// Takes a Python object into the pipeline, as Rust data when it is plain data of an exact builtin type
    /// (subclasses such as `bool` or user `str` subclasses stay Python objects, so that they come back as
    /// they went in).
    pub fn from_py(obj: Bound<'_, PyAny>) -> Value {
        if obj.is_exact_instance_of::<PyInt>() {
            if let Ok(i) = obj.extract::<i64>() {
                return Value::Int(i);
            }
        } else if obj.is_exact_instance_of::<PyString>() {
            if let Ok(s) = obj.extract::<String>() {
                return Value::Str(s);
            }
        } else if obj.is_exact_instance_of::<PyFloat>() {
            if let Ok(f) = obj.extract::<f64>() {
                return Value::Float(f);
            }
        } else if obj.is_exact_instance_of::<PyBytes>() {
            if let Ok(b) = obj.cast::<PyBytes>() {
                return Value::Bytes(b.as_bytes().to_vec());
            }
        } else if let Ok(b) = obj.cast::<PyBuffer>() {
            return Value::Buffer(Arc::clone(b.get().buffer()));
        }
        Value::Py(obj.unbind())
    }

    /// Like [`Value::from_py`], and a `list` or `tuple` becomes a [`Value::List`] of its elements (for a
    /// `disaggregate` that follows, so that it can split the batch without the GIL).
    pub fn from_py_splittable(obj: Bound<'_, PyAny>) -> Value {
        if let Ok(list) = obj.cast::<PyList>() {
            return Value::List(list.iter().map(|o| Value::Py(o.unbind())).collect());
        }
        if let Ok(tuple) = obj.cast::<PyTuple>() {
            return Value::List(tuple.iter().map(|o| Value::Py(o.unbind())).collect());
        }
        Value::from_py(obj)
    }

    /// A Python op's result as a [`Value`]: [`Value::from_py_splittable`] when a `disaggregate` follows
    /// (`split`), [`Value::from_py`] otherwise.
    pub(crate) fn from_op_output(obj: Bound<'_, PyAny>, split: bool) -> Value {
        if split { Value::from_py_splittable(obj) } else { Value::from_py(obj) }
    }

    /// The Python object for this value (a new object for Rust data; no copy for buffers).
    pub fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self {
            Value::Py(o) => o,
            Value::Str(s) => PyString::new(py, &s).into_any().unbind(),
            Value::Bytes(b) => PyBytes::new(py, &b).into_any().unbind(),
            Value::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
            Value::Float(f) => PyFloat::new(py, f).into_any().unbind(),
            Value::Buffer(b) => Py::new(py, PyBuffer::from_arc(b))?.into_any(),
            Value::List(items) => {
                let objs = items.into_iter().map(|v| v.into_py(py)).collect::<PyResult<Vec<_>>>()?;
                PyList::new(py, objs)?.into_any().unbind()
            }
        })
    }

    /// A short description for error messages (the type, and the text of plain data).
    pub fn describe(&self) -> String {
        match self {
            Value::Py(_) => "a Python object".to_owned(),
            Value::Str(s) => format!("str {s:?}"),
            Value::Bytes(b) => format!("bytes of length {}", b.len()),
            Value::Int(i) => format!("int {i}"),
            Value::Float(f) => format!("float {f}"),
            Value::Buffer(b) => format!("buffer {:?} {}", b.shape(), b.dtype()),
            Value::List(v) => format!("list of {} items", v.len()),
        }
    }
}
