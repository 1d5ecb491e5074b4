//! The Python literals of an NPY header (`{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }`), read
//! without Python: strings, integers, floats, `True`/`False`/`None`, tuples, lists and dicts, the way
//! `ast.literal_eval` reads them, with a bound on nesting. Nothing else (names, calls, operators) is accepted.

use std::fmt::{self, Write as _};

use spdl_source::tar_index::py_repr;

/// A header that is not a literal this parser reads: the message, worded as Python's own error would be
/// (`SyntaxError: ...`, `ValueError: ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LiteralError(pub(crate) String);

/// The deepest nesting of brackets the parser follows.
const MAX_DEPTH: usize = 32;

/// A Python literal of an NPY header.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Literal {
    /// `'text'`.
    Str(String),
    /// An integer.
    Int(i128),
    /// A float, as written.
    Float(String),
    /// `True` or `False`.
    Bool(bool),
    /// `None`.
    None,
    /// `(a, b)`.
    Tuple(Vec<Literal>),
    /// `[a, b]`.
    List(Vec<Literal>),
    /// `{k: v}`, in order.
    Dict(Vec<(Literal, Literal)>),
}

/// Python's `repr`.
impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn items(f: &mut fmt::Formatter<'_>, items: &[Literal]) -> fmt::Result {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{item}")?;
            }
            Ok(())
        }
        match self {
            Literal::Str(s) => f.write_str(&py_repr(s.as_bytes())),
            Literal::Int(i) => write!(f, "{i}"),
            Literal::Float(s) => f.write_str(s),
            Literal::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            Literal::None => f.write_str("None"),
            Literal::Tuple(t) => {
                f.write_char('(')?;
                items(f, t)?;
                f.write_str(if t.len() == 1 { ",)" } else { ")" })
            }
            Literal::List(l) => {
                f.write_char('[')?;
                items(f, l)?;
                f.write_char(']')
            }
            Literal::Dict(d) => {
                f.write_char('{')?;
                for (i, (k, v)) in d.iter().enumerate() {
                    write!(f, "{}{k}: {v}", if i > 0 { ", " } else { "" })?;
                }
                f.write_char('}')
            }
        }
    }
}

/// A recursive-descent reader of the Python literals NPY headers hold.
pub(crate) struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Self { text, pos: 0 }
    }

    fn error<T>(&self, what: &str) -> Result<T, LiteralError> {
        Err(LiteralError(match self.text[self.pos..].chars().next() {
            Some(c) => format!("SyntaxError: {what}, found {c:?} at offset {}", self.pos),
            None => format!("SyntaxError: {what}, found the end of the header"),
        }))
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    /// One literal, and nothing after it but white space.
    pub(crate) fn document(&mut self) -> Result<Literal, LiteralError> {
        let value = self.value(0)?;
        self.skip_space();
        if self.pos != self.text.len() {
            return self.error("expected the end of the header");
        }
        Ok(value)
    }

    fn value(&mut self, depth: usize) -> Result<Literal, LiteralError> {
        self.skip_space();
        match self.peek() {
            Some(b'{' | b'[' | b'(') if depth >= MAX_DEPTH => {
                Err(LiteralError(format!("RecursionError: nested deeper than {MAX_DEPTH} levels")))
            }
            Some(b'{') => {
                self.pos += 1;
                let mut items = Vec::new();
                let mut comma = false;
                while !self.close(b'}')? {
                    if !items.is_empty() && !comma {
                        return self.error("expected ',' or '}'");
                    }
                    let key = self.value(depth + 1)?;
                    self.skip_space();
                    if self.peek() != Some(b':') {
                        return self.error("expected ':'");
                    }
                    self.pos += 1;
                    items.push((key, self.value(depth + 1)?));
                    comma = self.comma();
                }
                Ok(Literal::Dict(items))
            }
            Some(b'[') => {
                self.pos += 1;
                Ok(Literal::List(self.items(b']', depth)?.0))
            }
            Some(b'(') => {
                self.pos += 1;
                let (mut items, comma) = self.items(b')', depth)?;
                // `(x)` is `x`; `(x,)` and `()` are tuples.
                Ok(if items.len() == 1 && !comma { items.remove(0) } else { Literal::Tuple(items) })
            }
            Some(q @ (b'\'' | b'"')) => self.string(q),
            Some(b'-' | b'+' | b'0'..=b'9' | b'.') => self.number(),
            Some(c) if c.is_ascii_alphabetic() => {
                let start = self.pos;
                while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_') {
                    self.pos += 1;
                }
                match &self.text[start..self.pos] {
                    "True" => Ok(Literal::Bool(true)),
                    "False" => Ok(Literal::Bool(false)),
                    "None" => Ok(Literal::None),
                    _ => {
                        self.pos = start;
                        self.error("expected a literal")
                    }
                }
            }
            _ => self.error("expected a literal"),
        }
    }

    /// `true` (and past it) at the closing bracket.
    fn close(&mut self, bracket: u8) -> Result<bool, LiteralError> {
        self.skip_space();
        let closed = self.peek() == Some(bracket);
        if closed {
            self.pos += 1;
        }
        Ok(closed)
    }

    /// The items of a list or tuple up to `bracket`, and whether a comma followed the last.
    fn items(&mut self, bracket: u8, depth: usize) -> Result<(Vec<Literal>, bool), LiteralError> {
        let mut items = Vec::new();
        let mut comma = false;
        loop {
            if self.close(bracket)? {
                return Ok((items, comma));
            }
            if !items.is_empty() && !comma {
                return self.error(&format!("expected ',' or '{}'", char::from(bracket)));
            }
            items.push(self.value(depth + 1)?);
            comma = self.comma();
        }
    }

    /// Past a comma, if one comes next.
    fn comma(&mut self) -> bool {
        self.skip_space();
        let comma = self.peek() == Some(b',');
        if comma {
            self.pos += 1;
        }
        comma
    }

    fn number(&mut self) -> Result<Literal, LiteralError> {
        let start = self.pos;
        if matches!(self.peek(), Some(b'-' | b'+')) {
            self.pos += 1;
        }
        while self.peek().is_some_and(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'_')) {
            if matches!(self.peek(), Some(b'e' | b'E'))
                && matches!(self.text.as_bytes().get(self.pos + 1), Some(b'-' | b'+'))
            {
                self.pos += 1;
            }
            self.pos += 1;
        }
        let text = &self.text[start..self.pos];
        let digits = text.trim_start_matches(['-', '+']);
        if !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit()) {
            return match text.parse::<i128>() {
                Ok(i) => Ok(Literal::Int(i)),
                Err(_) => Err(LiteralError(format!("ValueError: integer {text:.40} is too large"))),
            };
        }
        if text.replace('_', "").parse::<f64>().is_ok() && digits.bytes().any(|c| c.is_ascii_digit()) {
            return Ok(Literal::Float(text.to_owned()));
        }
        self.pos = start;
        self.error("expected a number")
    }

    fn string(&mut self, quote: u8) -> Result<Literal, LiteralError> {
        self.pos += 1;
        let mut out = String::new();
        let mut chars = self.text[self.pos..].char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                c if c as u32 == u32::from(quote) => {
                    self.pos += i + 1;
                    return Ok(Literal::Str(out));
                }
                '\n' => break,
                '\\' => {
                    let Some((_, e)) = chars.next() else { break };
                    let mut hex = |n: usize| -> Option<char> {
                        let digits: String = (0..n).filter_map(|_| chars.next().map(|(_, c)| c)).collect();
                        u32::from_str_radix(&digits, 16).ok().filter(|_| digits.len() == n).and_then(char::from_u32)
                    };
                    let decoded = match e {
                        'n' => Some('\n'),
                        't' => Some('\t'),
                        'r' => Some('\r'),
                        '0' => Some('\0'),
                        '\\' | '\'' | '"' => Some(e),
                        'x' => hex(2),
                        'u' => hex(4),
                        'U' => hex(8),
                        _ => {
                            out.push('\\'); // an unknown escape keeps its backslash, as in Python
                            Some(e)
                        }
                    };
                    match decoded {
                        Some(c) => out.push(c),
                        None => {
                            return Err(LiteralError(format!(
                                "SyntaxError: a bad escape in a string at offset {}",
                                self.pos + i
                            )));
                        }
                    }
                }
                c => out.push(c),
            }
        }
        self.pos -= 1;
        self.error("unterminated string")
    }
}
