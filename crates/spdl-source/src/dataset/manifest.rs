//! Manifest files: one key per line, or CSV/TSV with a header naming the key and label columns.

use std::collections::BTreeSet;

use super::{Dataset, Record};
use crate::error::{Result, SourceError};

/// Column names tried, in order, for the key when none is given.
const KEY_COLUMNS: [&str; 6] = ["key", "path", "file", "filename", "url", "image"];
/// Column names tried, in order, for the label when none is given.
const LABEL_COLUMNS: [&str; 4] = ["label", "class", "target", "y"];

/// The layout of a manifest.
///
/// Blank lines, and lines starting with `#` in the one-key-per-line format, are skipped. Keys keep the order of
/// the file (a manifest is often already in the intended order). Labels that all parse as integers are used as
/// is; otherwise they are class names, sorted and numbered from 0 (like class folders), and returned by
/// [`Dataset::classes`]. An empty label cell means no label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestFormat {
    /// One key per line, no labels.
    Lines,
    /// Delimited text with a header row. Fields may be double-quoted (`""` is a quote inside one).
    Delimited {
        /// The field separator, `,` for CSV, `\t` for TSV.
        delimiter: char,
        /// The key column's name; by default the first of `key`, `path`, `file`, `filename`, `url`, `image`
        /// present, else the first column.
        key_column: Option<String>,
        /// The label column's name; by default the first of `label`, `class`, `target`, `y` present, else none.
        label_column: Option<String>,
    },
}

impl ManifestFormat {
    /// CSV with the default columns.
    pub fn csv() -> Self {
        ManifestFormat::Delimited { delimiter: ',', key_column: None, label_column: None }
    }

    /// TSV with the default columns.
    pub fn tsv() -> Self {
        ManifestFormat::Delimited { delimiter: '\t', key_column: None, label_column: None }
    }

    /// Picks the format from a file name: `.csv`, `.tsv`, else one key per line.
    pub fn from_name(name: &str) -> Self {
        let lower = name.to_ascii_lowercase();
        if lower.ends_with(".csv") {
            Self::csv()
        } else if lower.ends_with(".tsv") {
            Self::tsv()
        } else {
            ManifestFormat::Lines
        }
    }
}

pub(super) fn parse(text: &str, name: &str, format: &ManifestFormat) -> Result<Dataset> {
    match format {
        ManifestFormat::Lines => {
            let records = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(|l| Record::new(l, None))
                .collect();
            Ok(Dataset::new(records, Vec::new()))
        }
        ManifestFormat::Delimited { delimiter, key_column, label_column } => {
            parse_delimited(text, name, *delimiter, key_column.as_deref(), label_column.as_deref())
        }
    }
}

fn parse_delimited(
    text: &str,
    name: &str,
    delimiter: char,
    key_column: Option<&str>,
    label_column: Option<&str>,
) -> Result<Dataset> {
    let err = |line: usize, reason: String| SourceError::Manifest { source_name: name.to_owned(), line, reason };
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l)).filter(|(_, l)| !l.trim().is_empty());
    let Some((header_line, header)) = lines.next() else { return Ok(Dataset::default()) };
    let header = split_fields(header.trim_start_matches('\u{feff}'), delimiter).map_err(|e| err(header_line, e))?;
    let find = |col: &str| header.iter().position(|h| h.trim().eq_ignore_ascii_case(col));
    let key_idx = match key_column {
        Some(col) => find(col).ok_or_else(|| err(header_line, format!("no key column {col:?} in {header:?}")))?,
        None => KEY_COLUMNS.iter().find_map(|c| find(c)).unwrap_or(0),
    };
    let label_idx = match label_column {
        Some(col) => Some(find(col).ok_or_else(|| err(header_line, format!("no label column {col:?} in {header:?}")))?),
        None => LABEL_COLUMNS.iter().find_map(|c| find(c)).filter(|&i| i != key_idx),
    };

    let mut rows: Vec<(String, Option<String>)> = Vec::new();
    for (line, text) in lines {
        let fields = split_fields(text, delimiter).map_err(|e| err(line, e))?;
        let key = fields.get(key_idx).map(|k| k.trim()).unwrap_or("");
        if key.is_empty() {
            return Err(err(line, format!("empty key (column {})", key_idx + 1)));
        }
        let label = match label_idx {
            Some(i) => {
                let value = fields
                    .get(i)
                    .ok_or_else(|| err(line, format!("{} fields, the label is in column {}", fields.len(), i + 1)))?;
                let value = value.trim();
                (!value.is_empty()).then(|| value.to_owned())
            }
            None => None,
        };
        rows.push((key.to_owned(), label));
    }

    let numeric = rows.iter().filter_map(|(_, l)| l.as_ref()).all(|l| l.parse::<i64>().is_ok());
    if numeric {
        // `numeric` guarantees every present label parses.
        let records = rows.into_iter().map(|(k, l)| Record::new(k, l.and_then(|l| l.parse().ok()))).collect();
        return Ok(Dataset::new(records, Vec::new()));
    }
    let classes: Vec<String> =
        rows.iter().filter_map(|(_, l)| l.clone()).collect::<BTreeSet<_>>().into_iter().collect();
    let records = rows
        .into_iter()
        .map(|(k, l)| {
            let label = l.and_then(|l| classes.binary_search(&l).ok()).map(|i| i as i64);
            Record::new(k, label)
        })
        .collect();
    Ok(Dataset::new(records, classes))
}

/// Splits one line into fields, honouring double quotes.
fn split_fields(line: &str, delimiter: char) -> std::result::Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.trim_end_matches('\r').chars().peekable();
    let mut quoted = false;
    let mut at_field_start = true;
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    field.push('"');
                } else {
                    quoted = false;
                }
            } else {
                field.push(c);
            }
        } else if c == '"' && at_field_start {
            quoted = true;
            at_field_start = false;
        } else if c == delimiter {
            fields.push(std::mem::take(&mut field));
            at_field_start = true;
        } else {
            field.push(c);
            at_field_start = false;
        }
    }
    if quoted {
        return Err("unterminated quoted field".to_owned());
    }
    fields.push(field);
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(ds: &Dataset) -> Vec<(String, Option<i64>)> {
        ds.iter().map(|r| (r.key.clone(), r.label)).collect()
    }

    #[test]
    fn lines() {
        let ds = parse("# comment\na/1.jpg\n\n  b/2.jpg  \r\n", "m.txt", &ManifestFormat::Lines).unwrap();
        assert_eq!(pairs(&ds), [("a/1.jpg".into(), None), ("b/2.jpg".into(), None)]);
    }

    #[test]
    fn csv_with_numeric_and_named_labels() {
        let csv = "path,label\nx/1.jpg,3\n\"y,2.jpg\",0\nz.jpg,\n";
        let ds = parse(csv, "m.csv", &ManifestFormat::csv()).unwrap();
        assert_eq!(pairs(&ds), [("x/1.jpg".into(), Some(3)), ("y,2.jpg".into(), Some(0)), ("z.jpg".into(), None)]);
        assert!(ds.classes().is_empty());

        let tsv = "id\tfile\tclass\n1\tb.jpg\tdog\n2\ta.jpg\tcat\n3\tc.jpg\tdog\n";
        let ds = parse(tsv, "m.tsv", &ManifestFormat::tsv()).unwrap();
        assert_eq!(ds.classes(), ["cat", "dog"]);
        assert_eq!(pairs(&ds), [("b.jpg".into(), Some(1)), ("a.jpg".into(), Some(0)), ("c.jpg".into(), Some(1))]);
    }

    #[test]
    fn explicit_columns_and_errors() {
        let fmt = ManifestFormat::Delimited {
            delimiter: ',',
            key_column: Some("uri".into()),
            label_column: Some("y2".into()),
        };
        let ds = parse("uri,y2\nk1,\"5\"\n", "m", &fmt).unwrap();
        assert_eq!(pairs(&ds), [("k1".into(), Some(5))]);
        let err = parse("a,b\nk,1\n", "m.csv", &fmt).unwrap_err();
        assert!(matches!(err, SourceError::Manifest { line: 1, .. }), "{err}");
        let err = parse("key,label\nk,1\n,2\n", "m.csv", &ManifestFormat::csv()).unwrap_err();
        assert!(err.to_string().contains("m.csv, line 3"), "{err}");
        let err = parse("key,label\nk\n", "m.csv", &ManifestFormat::csv()).unwrap_err();
        assert!(matches!(err, SourceError::Manifest { line: 2, .. }), "{err}");
        let err = parse("key\n\"open\n", "m.csv", &ManifestFormat::csv()).unwrap_err();
        assert!(err.to_string().contains("unterminated"), "{err}");
        assert!(parse("", "m.csv", &ManifestFormat::csv()).unwrap().is_empty());
    }

    #[test]
    fn format_from_name() {
        assert_eq!(ManifestFormat::from_name("A.CSV"), ManifestFormat::csv());
        assert_eq!(ManifestFormat::from_name("a.tsv"), ManifestFormat::tsv());
        assert_eq!(ManifestFormat::from_name("a.txt"), ManifestFormat::Lines);
    }

    #[test]
    fn from_manifest_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.csv");
        std::fs::write(&path, "key,label\na.jpg,1\n").unwrap();
        assert_eq!(pairs(&Dataset::from_manifest(&path).unwrap()), [("a.jpg".into(), Some(1))]);
        assert!(Dataset::from_manifest(dir.path().join("none.csv")).unwrap_err().is_not_found());
    }
}
