//! The typed keyword options of spdl-py's decoders in the stubs.
//!
//! A decoder's options are declared once, in Rust, with `keyword_options!` (crates/spdl-py/src/io/options.rs):
//! a struct with one field per keyword, its Rust type, an optional Python type (`as "..."`) and its default.
//! The native functions take them as `**options`, annotated `Unpack[StructName]` in `#[pyo3(signature)]`.
//! This module reads those declarations out of the sources and writes each one the stubs use as a
//! `TypedDict` of the same name, so that a type checker knows every keyword, its type and (in a comment) its
//! default, and the declaration stays the only place they are written.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// The sources of spdl-py, relative to the repository root.
const SOURCES: &str = "crates/spdl-py/src";

/// One keyword option: its name, its Python type and its default, as Python.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: String,
    pub py_type: String,
    pub default: String,
}

/// One `keyword_options!` struct: its name, the structs whose keywords it also takes, and its own fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub name: String,
    pub doc: String,
    pub parts: Vec<String>,
    pub fields: Vec<Field>,
}

/// Every `keyword_options!` declaration in spdl-py's sources, by struct name (names are unique).
pub fn declared(root: &Path) -> Result<Vec<Options>> {
    let mut out: Vec<Options> = Vec::new();
    let mut files = Vec::new();
    collect_rs(&root.join(SOURCES), &mut files)?;
    files.sort();
    for file in files {
        let text = fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        for options in parse(&text).with_context(|| format!("reading keyword_options! in {}", file.display()))? {
            if out.iter().any(|o| o.name == options.name) {
                bail!("keyword_options! struct {} is declared twice (the stubs name it)", options.name);
            }
            out.push(options);
        }
    }
    Ok(out)
}

fn collect_rs(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_rs(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The `TypedDict`s a stub needs: those its text names in `Unpack[...]`, with the ones they extend, each
/// before its users. Empty when the stub names none.
pub fn typed_dicts(stub: &str, declared: &[Options]) -> Result<String> {
    let mut wanted: Vec<String> = Vec::new();
    for piece in stub.split("Unpack[").skip(1) {
        let name: String = piece.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        add_with_parts(&name, declared, &mut wanted)?;
    }
    let mut out = String::new();
    for name in &wanted {
        let options = declared.iter().find(|o| &o.name == name).expect("added only when declared");
        out.push_str(&render(options));
    }
    Ok(out)
}

fn add_with_parts(name: &str, declared: &[Options], wanted: &mut Vec<String>) -> Result<()> {
    if wanted.iter().any(|w| w == name) {
        return Ok(());
    }
    let Some(options) = declared.iter().find(|o| o.name == name) else {
        bail!("a signature names Unpack[{name}], but no keyword_options! struct {name} is declared in {SOURCES}");
    };
    for part in &options.parts {
        add_with_parts(part, declared, wanted)?;
    }
    wanted.push(name.to_string());
    Ok(())
}

/// One struct as a `TypedDict` (every keyword optional, as in the call; the default in a comment).
fn render(options: &Options) -> String {
    let bases = if options.parts.is_empty() { "TypedDict".to_string() } else { options.parts.join(", ") };
    let mut out = format!("@type_check_only\nclass {}({bases}, total=False):\n", options.name);
    if !options.doc.is_empty() {
        out.push_str(&format!("    \"\"\"{}\"\"\"\n\n", options.doc.replace('\\', "\\\\").replace("\"\"\"", "'''")));
    }
    for f in &options.fields {
        out.push_str(&format!("    {}: {}  # default: {}\n", f.name, f.py_type, f.default));
    }
    if options.fields.is_empty() && options.doc.is_empty() {
        out.push_str("    ...\n");
    }
    out.push('\n');
    out
}

/// The `keyword_options!` declarations in one source file.
pub fn parse(text: &str) -> Result<Vec<Options>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("\nkeyword_options! {") {
        let body_start = at + "\nkeyword_options! {".len();
        let body_len = balanced(&rest[body_start..], '{', '}').context("an unclosed keyword_options! {")?;
        out.push(parse_one(&rest[body_start..body_start + body_len])?);
        rest = &rest[body_start + body_len..];
    }
    Ok(out)
}

/// The length of `text` up to (not including) the `close` that ends a group opened just before it.
fn balanced(text: &str, open: char, close: char) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_str = false;
    let mut prev = ' ';
    for (i, c) in text.char_indices() {
        if in_str {
            if c == '"' && prev != '\\' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
        } else if c == open {
            depth += 1;
        } else if c == close {
            if depth == 0 {
                return Some(i);
            }
            depth -= 1;
        }
        prev = if prev == '\\' && c == '\\' { ' ' } else { c };
    }
    None
}

fn parse_one(body: &str) -> Result<Options> {
    let mut doc = Vec::new();
    let mut header = String::new();
    let mut lines = body.lines();
    for line in lines.by_ref() {
        let t = line.trim();
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.trim().to_string());
        } else if t.starts_with("struct ") {
            header = t.to_string();
            break;
        }
    }
    let header = header.strip_prefix("struct ").context("keyword_options! without a struct")?;
    let name: String = header.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    let mut parts = Vec::new();
    if let Some(list) = header[name.len()..].trim_start().strip_prefix('[') {
        let list = list.split(']').next().unwrap_or_default();
        for part in list.split(',').filter(|p| !p.trim().is_empty()) {
            let (_, ty) = part.split_once(':').with_context(|| format!("{name}: a part without a type: {part:?}"))?;
            parts.push(ty.trim().to_string());
        }
    }
    let open = body.find(&format!("struct {name}")).context("the struct")?;
    let after = &body[open..];
    let fields_start = after.find('{').context("the struct's fields")? + 1;
    let fields_len = balanced(&after[fields_start..], '{', '}').context("unclosed fields")?;
    let mut fields = Vec::new();
    for item in split_top(&after[fields_start..fields_start + fields_len]) {
        let item: String = item.lines().filter(|l| !l.trim_start().starts_with("#[")).collect::<Vec<_>>().join(" ");
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        fields.push(parse_field(item).with_context(|| format!("{name}: field {item:?}"))?);
    }
    Ok(Options { name, doc: doc.join(" "), parts, fields })
}

/// `name: Type [as "python"] = default`.
fn parse_field(item: &str) -> Result<Field> {
    let (name, rest) = item.split_once(':').context("no `:`")?;
    let (ty, default) = split_top_eq(rest).context("no `= default`")?;
    let py_type = match ty.split_once(" as \"") {
        Some((_, py)) => py.trim().strip_suffix('"').context("an unclosed Python type")?.replace("\\\"", "\""),
        None => python_type(ty.trim())?,
    };
    Ok(Field { name: name.trim().to_string(), py_type, default: python_default(default.trim()) })
}

/// Splits `ty = default` at the `=` that is not inside brackets or a string.
fn split_top_eq(text: &str) -> Option<(&str, &str)> {
    let mut depth = 0i32;
    let mut in_str = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if std::mem::take(&mut escaped) {
            continue;
        }
        match c {
            '\\' if in_str => escaped = true,
            '"' => in_str = !in_str,
            '<' | '(' | '[' if !in_str => depth += 1,
            '>' | ')' | ']' if !in_str => depth -= 1,
            '=' if !in_str && depth == 0 => return Some((&text[..i], &text[i + 1..])),
            _ => {}
        }
    }
    None
}

/// The items of a field list, split at the commas outside brackets and strings.
fn split_top(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut depth = 0i32;
    let mut in_str = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        let mut escaped = false;
        for c in line.chars() {
            if std::mem::take(&mut escaped) {
                cur.push(c);
                continue;
            }
            match c {
                '\\' if in_str => escaped = true,
                '"' => in_str = !in_str,
                '<' | '(' | '[' | '{' if !in_str => depth += 1,
                '>' | ')' | ']' | '}' if !in_str => depth -= 1,
                ',' if !in_str && depth == 0 => {
                    out.push(std::mem::take(&mut cur));
                    continue;
                }
                _ => {}
            }
            cur.push(c);
        }
        cur.push('\n');
    }
    out.push(cur);
    out
}

/// The Python type of a keyword's Rust type (what `FromPyObject` takes).
pub fn python_type(ty: &str) -> Result<String> {
    let ty = ty.replace(' ', "");
    if let Some(inner) = ty.strip_prefix("Option<").and_then(|t| t.strip_suffix('>')) {
        return Ok(format!("{} | None", python_type(inner)?));
    }
    if let Some(inner) = ty.strip_prefix('(').and_then(|t| t.strip_suffix(')')) {
        let elems: Result<Vec<String>> = split_top(inner).iter().map(|e| python_type(e.trim())).collect();
        return Ok(format!("tuple[{}]", elems?.join(", ")));
    }
    Ok(match ty.as_str() {
        "String" | "&str" => "str",
        "bool" => "bool",
        "f32" | "f64" => "float",
        "u8" | "u16" | "u32" | "u64" | "usize" | "i32" | "i64" | "Int" => "int",
        "Py<PyAny>" => "Any",
        "Py<PyDict>" => "dict[str, Any]",
        other => bail!("no Python type for the Rust type {other:?}: add `as \"<python type>\"` to the field"),
    }
    .to_string())
}

/// A Rust default expression written as Python (for the stub's comment).
pub fn python_default(expr: &str) -> String {
    let e = expr.trim();
    if let Some(s) = e.strip_suffix(".to_owned()").or_else(|| e.strip_suffix(".to_string()")) {
        return s.to_string();
    }
    if let Some(n) = e.strip_prefix("Int::from(").and_then(|s| s.strip_suffix(')')) {
        return n.to_string();
    }
    match e {
        "true" => "True".to_string(),
        "false" => "False".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = r#"
use x;

keyword_options! {
    /// The options of `f`.
    struct FArgs {
        size: Option<(Int, Int)> = None,
        // a comment
        pixel_format: String = "rgb".to_owned(),
        channels: Option<Py<PyAny>> as "Literal[\"mono\"] | list[int] | None" = None,
        threads: usize = 1,
    }
}

keyword_options! {
    struct GArgs [f: FArgs] {
        strict: bool = true,
        batch: Int = Int::from(32),
    }
}
"#;

    #[test]
    fn declarations_are_read_with_types_and_defaults() {
        let parsed = parse(SOURCE).unwrap();
        assert_eq!(parsed.len(), 2);
        let f = &parsed[0];
        assert_eq!(f.name, "FArgs");
        assert_eq!(f.doc, "The options of `f`.");
        let got: Vec<(&str, &str, &str)> =
            f.fields.iter().map(|x| (x.name.as_str(), x.py_type.as_str(), x.default.as_str())).collect();
        assert_eq!(
            got,
            [
                ("size", "tuple[int, int] | None", "None"),
                ("pixel_format", "str", "\"rgb\""),
                ("channels", "Literal[\"mono\"] | list[int] | None", "None"),
                ("threads", "int", "1"),
            ]
        );
        assert_eq!(parsed[1].parts, ["FArgs"]);
        assert_eq!(parsed[1].fields[1].default, "32");
    }

    #[test]
    fn a_stub_gets_the_typed_dicts_it_names_with_their_bases_first() {
        let parsed = parse(SOURCE).unwrap();
        let out = typed_dicts("def g(**options: Unpack[GArgs]) -> None: ...", &parsed).unwrap();
        let f = out.find("class FArgs(TypedDict, total=False):").unwrap();
        let g = out.find("class GArgs(FArgs, total=False):").unwrap();
        assert!(f < g);
        assert!(out.contains("    size: tuple[int, int] | None  # default: None\n"));
        assert!(typed_dicts("def h(**options: Unpack[Nope]) -> None: ...", &parsed).is_err());
    }
}
