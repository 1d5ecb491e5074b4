//! Keyword options: each decoder's options are one struct, declared with `keyword_options!` (names, types
//! and defaults) and taken from a call's `**options` by [`KeywordOptions::from_kwargs`], the one place that
//! reads them. The plain function and its native op extract the same struct, then convert it to spdl-io's
//! options (validation and error text) with one method of it.

use pyo3::exceptions::PyTypeError;
use pyo3::impl_::extract_argument::argument_extraction_error;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A set of keyword options with defaults, filled from a call's keyword arguments.
pub(crate) trait KeywordOptions: Default {
    /// Sets the option named `key` from `value`; `Ok(false)` when no option has that name.
    fn set(&mut self, key: &str, value: &Bound<'_, PyAny>) -> PyResult<bool>;

    /// The options of a call of `func` (the defaults, overridden by `kwargs`). As with PyO3's own
    /// signatures, an unknown keyword is a `TypeError` naming the function, a value of the wrong type a
    /// `TypeError` naming the argument.
    fn from_kwargs(func: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut out = Self::default();
        for (key, value) in kwargs.into_iter().flat_map(|k| k.iter()) {
            let key: String = key.extract()?;
            if !out.set(&key, &value)? {
                return Err(PyTypeError::new_err(format!("{func}() got an unexpected keyword argument '{key}'")));
            }
        }
        Ok(out)
    }
}

/// Extracts the keyword argument `key`, with PyO3's error for a wrong type (`argument 'key': ...`).
pub(crate) fn arg<'a, 'py, T>(value: &'a Bound<'py, PyAny>, key: &str) -> PyResult<T>
where
    T: FromPyObject<'a, 'py>,
    T::Error: Into<PyErr>,
{
    value.extract::<T>().map_err(|e| argument_extraction_error(value.py(), key, e.into()))
}

/// The `TypeError` of a missing required keyword argument, worded as PyO3's.
pub(crate) fn missing(func: &str, key: &str) -> PyErr {
    PyTypeError::new_err(format!("{func}() missing 1 required keyword argument: '{key}'"))
}

/// Declares a decoder's keyword options: a struct with one field per keyword (`name: Type = default`, or
/// `name: Type as "python type" = default` where the Rust type does not say it), its `Default`, and its
/// [`KeywordOptions`] impl. `struct Name [part: Part, ...] { ... }` also takes the keywords of other option
/// structs (e.g. a batch's per-clip options), kept in the named fields.
///
/// This is the only declaration of the options: a function that takes them has `**options: "Unpack[Name]"`
/// in its signature, and `cargo xtask stubs` writes `Name` into the stubs as a `TypedDict` read from this
/// declaration (names, Python types, defaults), so type checkers know every keyword.
macro_rules! keyword_options {
    (
        $(#[$meta:meta])*
        struct $name:ident $([$($part:ident: $part_ty:ty),+ $(,)?])? {
            $($(#[$fmeta:meta])* $field:ident: $ty:ty $(as $py_type:literal)? = $default:expr),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug)]
        pub(crate) struct $name {
            $($(pub(crate) $part: $part_ty,)+)?
            $($(#[$fmeta])* pub(crate) $field: $ty,)*
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $($($part: <$part_ty>::default(),)+)? $($field: $default,)* }
            }
        }

        impl $crate::io::options::KeywordOptions for $name {
            fn set(&mut self, key: &str, value: &pyo3::Bound<'_, pyo3::PyAny>) -> pyo3::PyResult<bool> {
                match key {
                    $(stringify!($field) => {
                        self.$field = $crate::io::options::arg(value, key)?;
                        Ok(true)
                    })*
                    _ => {
                        $($(if $crate::io::options::KeywordOptions::set(&mut self.$part, key, value)? {
                            return Ok(true);
                        })+)?
                        Ok(false)
                    }
                }
            }
        }
    };
}
#[cfg_attr(not(feature = "loader"), allow(unused_imports))]
pub(crate) use keyword_options;
