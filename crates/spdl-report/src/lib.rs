//! How spdl-rs shows a failure to a person: [`error_chain`] writes an error and its causes on one line,
//! [`panic_message`] the message of a caught panic ([`panicked`]: as an item's failure); and [`proc_field`], the
//! reader of the memory and I/O figures of Linux's `/proc` files. Std only, so that every crate of the workspace
//! uses these and none writes its own.
//!
//! # The rule for error messages
//!
//! An error's `Display` names its own layer only (`"{path}: cannot read"`), and the error below it is
//! reached through [`Error::source`], never formatted into the text as well. A printer of the chain
//! ([`error_chain`], anyhow's `{:#}` and `{:?}`) then shows each cause exactly once. An error that
//! formats its cause into its own text *and* returns it from `source()` would have that cause printed
//! twice (three times, one layer further up).
//!
//! [`error_chain`] also skips a cause whose text is already in what it has written, for errors of other
//! crates that do not follow the rule.
//!
//! # Example
//! ```
//! #[derive(Debug, thiserror::Error)]
//! #[error("{path}: cannot read")]
//! struct ReadError {
//!     path: String,
//!     #[source]
//!     source: std::io::Error,
//! }
//!
//! let err = ReadError { path: "/data/a.jpg".into(), source: std::io::ErrorKind::NotFound.into() };
//! assert_eq!(err.to_string(), "/data/a.jpg: cannot read");
//! assert_eq!(spdl_report::error_chain(&err), "/data/a.jpg: cannot read: entity not found");
//! ```

use std::any::Any;
use std::error::Error;

/// Separates an error from its cause in [`error_chain`]'s text.
const SEPARATOR: &str = ": ";

/// The error and each of its causes (its [`Error::source`] chain), outermost first, joined by `": "`.
///
/// A cause whose text already appears in the text written so far is left out: an error of another crate
/// that formats its cause into its own message (as some `std::io::Error`s and storage clients do) still
/// shows that cause once. Empty texts are left out too.
///
/// Use it wherever an error is shown to a person or kept as text: log lines, an item's failure message,
/// a Python exception's message.
///
/// # Example
/// ```
/// use std::fmt;
///
/// #[derive(Debug)]
/// struct Outer(std::io::Error);
/// impl fmt::Display for Outer {
///     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
///         f.write_str("cannot list /data")
///     }
/// }
/// impl std::error::Error for Outer {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         Some(&self.0)
///     }
/// }
///
/// let os = std::io::Error::other("No such file or directory (os error 2)");
/// assert_eq!(
///     spdl_report::error_chain(&Outer(os)),
///     "cannot list /data: No such file or directory (os error 2)"
/// );
///
/// // A boxed error (`Box<dyn Error + Send + Sync>`) works through `&*`.
/// let boxed: Box<dyn std::error::Error + Send + Sync> = "bad header".into();
/// assert_eq!(spdl_report::error_chain(&*boxed), "bad header");
/// ```
pub fn error_chain(err: &dyn Error) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(cause) = cur {
        let text = cause.to_string();
        if !text.is_empty() && !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(SEPARATOR);
            }
            out.push_str(&text);
        }
        cur = cause.source();
    }
    out
}

/// The message of a caught panic: the payload of [`std::panic::catch_unwind`]'s `Err` (or of a joined
/// thread's), when it is a `&str` or a `String` (what `panic!` makes), else `"non-string panic payload"`.
///
/// # Example
/// ```
/// let payload = std::panic::catch_unwind(|| panic!("index {} out of range", 7)).unwrap_err();
/// assert_eq!(spdl_report::panic_message(payload.as_ref()), "index 7 out of range");
///
/// let payload = std::panic::catch_unwind(|| std::panic::panic_any(42_u32)).unwrap_err();
/// assert_eq!(spdl_report::panic_message(&*payload), "non-string panic payload");
/// ```
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// A caught panic as an item's failure: `"panicked: "` and [`panic_message`] (the engine's wording, and that
/// of every crate that records a panic against an item).
///
/// # Example
/// ```
/// let payload = std::panic::catch_unwind(|| panic!("bad item")).unwrap_err();
/// assert_eq!(spdl_report::panicked(payload.as_ref()), "panicked: bad item");
/// ```
pub fn panicked(payload: &(dyn Any + Send)) -> String {
    format!("panicked: {}", panic_message(payload))
}

/// The value of the `Name: <n> [kB]` line called `name` in the text of a Linux `/proc` file (`/proc/meminfo`,
/// `/proc/self/status`, `/proc/[pid]/smaps_rollup`, `/proc/[pid]/io`), in bytes: a value with a unit (`kB`) is
/// in KiB, a bare one (`/proc/[pid]/io`) in bytes. `None` when no line has that name; `Some(Err(line))` (the
/// line, trimmed to 80 characters) when its value is not a number. The one reader of these lines, for every
/// crate that reads memory or I/O figures from `/proc`.
///
/// # Example
/// ```
/// let meminfo = "MemTotal:       16318432 kB\nMemAvailable:   12000000 kB\n";
/// assert_eq!(spdl_report::proc_field(meminfo, "MemAvailable"), Some(Ok(12_000_000 * 1024)));
/// assert_eq!(spdl_report::proc_field("read_bytes: 7\n", "read_bytes"), Some(Ok(7)));
/// assert_eq!(spdl_report::proc_field(meminfo, "SwapTotal"), None);
/// assert!(spdl_report::proc_field("Pss: lots kB\n", "Pss").unwrap().is_err());
/// ```
pub fn proc_field(text: &str, name: &str) -> Option<Result<u64, String>> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        if parts.next()?.strip_suffix(':')? != name {
            return None;
        }
        let bad = || line.trim().chars().take(80).collect::<String>();
        let Some(Ok(n)) = parts.next().map(str::parse::<u64>) else { return Some(Err(bad())) };
        let scale = if parts.next().is_some() { 1024 } else { 1 };
        Some(Ok(n.saturating_mul(scale)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;

    /// One layer: its own text, and the error below it through `source()`.
    #[derive(Debug)]
    struct Layer {
        text: &'static str,
        source: Option<Box<Layer>>,
    }

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.text)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.source.as_deref().map(|e| e as &(dyn Error + 'static))
        }
    }

    fn chain(texts: &[&'static str]) -> Layer {
        let mut iter = texts.iter().rev();
        let mut err = Layer { text: iter.next().expect("a text"), source: None };
        for &text in iter {
            err = Layer { text, source: Some(Box::new(err)) };
        }
        err
    }

    #[test]
    fn each_cause_once_in_order() {
        let err = chain(&["cannot list the dataset", "cannot list /data", "open /data", "os error 2"]);
        assert_eq!(error_chain(&err), "cannot list the dataset: cannot list /data: open /data: os error 2");
    }

    #[test]
    fn a_cause_already_in_the_text_is_skipped() {
        // The middle layer embeds its cause, as some foreign errors do.
        let err = chain(&["cannot read /data", "open: No such file (os error 2)", "No such file (os error 2)"]);
        let text = error_chain(&err);
        assert_eq!(text, "cannot read /data: open: No such file (os error 2)");
        assert_eq!(text.matches("os error 2").count(), 1);
    }

    #[test]
    fn empty_texts_are_skipped() {
        assert_eq!(error_chain(&chain(&["outer", "", "inner"])), "outer: inner");
        assert_eq!(error_chain(&chain(&["", "inner"])), "inner");
    }

    #[test]
    fn panic_payloads() {
        let s: Box<dyn Any + Send> = Box::new("static");
        assert_eq!(panic_message(&*s), "static");
        let s: Box<dyn Any + Send> = Box::new(String::from("owned"));
        assert_eq!(panic_message(&*s), "owned");
        let s: Box<dyn Any + Send> = Box::new(1_i32);
        assert_eq!(panic_message(&*s), "non-string panic payload");
    }
}
