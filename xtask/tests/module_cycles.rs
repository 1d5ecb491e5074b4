//! The Rust modules of each crate import each other without cycles.
//!
//! For every crate of the workspace (`crates/*`, `xtask`, `benches`), at every level of its module tree
//! (the crate root's modules, then the children of each module directory): module `a` references its sibling
//! `b` when a file of `a` (`a.rs` or `a/**.rs`) names a path into `b`, through `crate::`, `self::` or
//! `super::` (`crate::b::X`, `use crate::{b, ..}`, `super::b` from `a.rs`, `crate::m::b` from `m/a.rs`).
//! These references must form a DAG: what two modules share lives in one that both import, or in the lower
//! one. Comments, string literals and `#[cfg(test)] mod` blocks are left out; items re-exported by a parent
//! (`crate::Error`) are the parent's, not an edge.
//!
//! Plain string scanning of the sources, no parser: run with `cargo test -p xtask --test module_cycles`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A path the code names: its line, its segments (absolute, as far as written) and the name a `use` gives it.
struct Ref {
    line: usize,
    path: Vec<String>,
    alias: Option<String>,
}

/// One edge of a level's graph, with the first place that makes it (for the failure message).
type Edges = BTreeMap<String, BTreeMap<String, String>>;

#[test]
fn modules_import_each_other_without_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();
    let mut crates: Vec<PathBuf> = Vec::new();
    for entry in fs::read_dir(root.join("crates")).expect("read crates/") {
        let dir = entry.expect("crates/ entry").path();
        if dir.join("src").is_dir() {
            crates.push(dir);
        }
    }
    crates.push(root.join("xtask"));
    crates.push(root.join("benches"));
    crates.sort();

    let mut report = Report::default();
    let mut checked = 0;
    for krate in &crates {
        let src = krate.join("src");
        if !src.is_dir() {
            continue;
        }
        let name = krate.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        checked += 1;
        check_dir(&root, &name, &src, &[], true, &mut report);
    }
    assert!(checked >= 10, "found only {checked} crates under {}", root.display());
    if std::env::var_os("MODULE_GRAPH").is_some() {
        eprintln!("{}", report.graphs.join("\n"));
    }
    let failures = report.failures;
    assert!(failures.is_empty(), "modules that import each other in a cycle:\n{}", failures.join("\n"));
}

/// Checks the graph of the child modules of the module directory `dir` (module path `path`), then recurses
/// into each child that is a directory.
/// The check on a made-up crate: a cycle through `crate::` and one through `super::` (between the files of
/// a module directory) are found, and what comments, strings and test modules name is not.
#[test]
fn finds_cycles_and_ignores_comments_strings_and_tests() {
    let dir = std::env::temp_dir().join(format!("module_cycles_selftest_{}", std::process::id()));
    let src = dir.join("src");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(src.join("m")).expect("create the test crate");
    let files = [
        ("lib.rs", "mod a;\nmod b;\nmod m;\nmod q;\npub use q::Thing;\n"),
        ("a.rs", "use crate::{b::Bee, m};\n"),
        // `crate::Thing` is `q`'s, re-exported by the root.
        ("b.rs", "use crate::Thing;\npub struct Bee;\nfn f() { crate::a::g() }\n"),
        // None of these is a reference to `b`.
        (
            "q.rs",
            "// crate::b\n/// [`crate::b`]\nconst S: &str = \"crate::b::X\";\n#[cfg(test)]\nmod tests {\n    use crate::b;\n}\n",
        ),
        ("m/mod.rs", "mod x;\nmod y;\n"),
        ("m/x.rs", "use super::y::Why;\n"),
        ("m/y.rs", "fn f() -> char { '{' }\nuse crate::m::x as ex;\n"),
    ];
    for (name, text) in files {
        fs::write(src.join(name), text).expect("write the test crate");
    }
    let mut report = Report::default();
    check_dir(&dir, "t", &src, &[], true, &mut report);
    let _ = fs::remove_dir_all(&dir);
    let found = report.failures.join("\n");
    assert_eq!(report.failures.len(), 2, "{found}");
    assert!(found.contains("t: a -> b -> a"), "{found}");
    assert!(found.contains("t::m: x -> y -> x"), "{found}");
    assert!(!found.contains('q'), "{found}");
    assert!(report.graphs.contains(&"t: b -> a, q".to_string()), "{:?}", report.graphs);
    assert!(!report.graphs.iter().any(|g| g.starts_with("t: q")), "{:?}", report.graphs);
}

/// What the check found: its failures, and each level's graph (printed with `MODULE_GRAPH=1`).
#[derive(Default)]
struct Report {
    failures: Vec<String>,
    graphs: Vec<String>,
}

fn check_dir(root: &Path, krate: &str, dir: &Path, path: &[String], crate_root: bool, report: &mut Report) {
    let children = child_modules(dir, crate_root);
    let names: BTreeSet<String> = children.keys().cloned().collect();
    let parents: Vec<PathBuf> = if crate_root {
        vec![dir.join("lib.rs"), dir.join("main.rs")]
    } else {
        vec![dir.join("mod.rs"), dir.with_extension("rs")]
    };
    let mut reexported = BTreeMap::new();
    for parent in &parents {
        reexported.extend(reexports(parent, path, &names));
    }
    let mut edges: Edges = BTreeMap::new();
    for (child, files) in &children {
        for file in files {
            let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let file_path = module_path_of(dir, path, file);
            let code = strip_tests(&strip_comments_and_strings(&text));
            for Ref { line, path: target, .. } in references(&code, &file_path) {
                // A reference into a sibling of `child` at this level: `path ++ [sibling, ..]`, or to a name
                // the parent re-exports from it.
                if target.len() > path.len() && target[..path.len()] == *path {
                    let name = &target[path.len()];
                    let sibling = if names.contains(name) { Some(name) } else { reexported.get(name) };
                    if let Some(sibling) = sibling.filter(|s| *s != child) {
                        let at = format!("{}:{line}", file.strip_prefix(root).unwrap_or(file).display());
                        edges.entry(child.clone()).or_default().entry(sibling.clone()).or_insert(at);
                    }
                }
            }
        }
    }
    let level = if path.is_empty() { krate.to_string() } else { format!("{krate}::{}", path.join("::")) };
    for (cycle, others) in cycles(&edges) {
        let steps: Vec<String> =
            cycle.windows(2).map(|w| format!("    {} -> {} ({})", w[0], w[1], edges[&w[0]][&w[1]])).collect();
        let also = if others.is_empty() {
            String::new()
        } else {
            format!(" (in a cycle with these too: {})", others.join(", "))
        };
        report.failures.push(format!("{level}: {}{also}\n{}", cycle.join(" -> "), steps.join("\n")));
    }
    for (from, tos) in &edges {
        let tos: Vec<&str> = tos.keys().map(String::as_str).collect();
        report.graphs.push(format!("{level}: {from} -> {}", tos.join(", ")));
    }
    for child in children.keys() {
        let sub = dir.join(child);
        if sub.is_dir() {
            let mut p = path.to_vec();
            p.push(child.clone());
            check_dir(root, krate, &sub, &p, false, report);
        }
    }
}

/// The child modules of a module directory and the files of each (`a.rs`, and `a/**.rs`).
fn child_modules(dir: &Path, crate_root: bool) -> BTreeMap<String, Vec<PathBuf>> {
    let mut out: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut entries: Vec<PathBuf> =
        fs::read_dir(dir).expect("read module dir").map(|e| e.expect("dir entry").path()).collect();
    entries.sort();
    for p in entries {
        let Some(stem) = p.file_stem().map(|s| s.to_string_lossy().into_owned()) else { continue };
        if p.is_dir() {
            // `src/bin/*.rs` are crates of their own.
            if crate_root && stem == "bin" {
                continue;
            }
            let mut files = Vec::new();
            rs_files(&p, &mut files);
            if !files.is_empty() {
                out.entry(stem).or_default().extend(files);
            }
        } else if p.extension().is_some_and(|e| e == "rs") {
            let parent_file = stem == "mod" || (crate_root && (stem == "lib" || stem == "main"));
            if !parent_file {
                out.entry(stem).or_default().push(p);
            }
        }
    }
    out
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> =
        fs::read_dir(dir).expect("read module dir").map(|e| e.expect("dir entry").path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file below `dir` (whose module path is `path`): `dir/a/b.rs` is `path ++ [a, b]`,
/// `dir/a/mod.rs` is `path ++ [a]`.
fn module_path_of(dir: &Path, path: &[String], file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(dir).expect("file below its module dir");
    let mut out = path.to_vec();
    let parts: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            let stem = part.strip_suffix(".rs").unwrap_or(part);
            if stem != "mod" {
                out.push(stem.to_string());
            }
        } else {
            out.push(part.clone());
        }
    }
    out
}

/// The source with comments removed and the contents of string and char literals blanked (line breaks
/// kept, so that line numbers still hold).
fn strip_comments_and_strings(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let keep_newlines = |s: &[char], out: &mut String| s.iter().filter(|&&ch| ch == '\n').for_each(|_| out.push('\n'));
    while i < c.len() {
        let at = |k: usize| c.get(i + k).copied().unwrap_or('\0');
        if at(0) == '/' && at(1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if at(0) == '/' && at(1) == '*' {
            let start = i;
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            keep_newlines(&c[start..i.min(c.len())], &mut out);
        } else if (at(0) == 'r' || (at(0) == 'b' && at(1) == 'r')) && !prev_is_ident(&c, i) && {
            let k = if at(0) == 'b' { 1 } else { 0 };
            let mut j = i + k + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            c.get(j) == Some(&'"')
        } {
            // Raw string: r#"..."#.
            let start = i;
            i += if at(0) == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while c[i] == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            while i < c.len() {
                if c[i] == '"' && (0..hashes).all(|h| c.get(i + 1 + h) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            out.push_str("\"\"");
            keep_newlines(&c[start..i.min(c.len())], &mut out);
        } else if at(0) == '"' {
            let start = i;
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
            keep_newlines(&c[start..i.min(c.len())], &mut out);
        } else if at(0) == '\'' && (at(1) == '\\' || (at(1) != '\0' && at(2) == '\'')) {
            // A char literal (a lifetime has no closing quote right after its first character).
            i += 1;
            while i < c.len() && c[i] != '\'' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn prev_is_ident(c: &[char], i: usize) -> bool {
    i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_')
}

/// The code with every test-only inline module (`#[cfg(test)]` or `#[cfg(all(test, ..))]`, then
/// `mod NAME { .. }`) blanked (line breaks kept).
fn strip_tests(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(pos) = rest.find("#[cfg(") {
        out.push_str(&rest[..pos]);
        let attr_len = rest.len() - pos - skip_attributes(&rest[pos..]).len();
        let attr: String = rest[pos..pos + attr_len].chars().filter(|c| !c.is_whitespace()).collect();
        let test_only = attr.starts_with("#[cfg(test)]") || attr.starts_with("#[cfg(all(test,");
        // Where the attributes end: the item they are on.
        let item = skip_attributes(&rest[pos..]);
        let is_mod = ["mod", "pub mod", "pub(crate) mod", "pub(super) mod"]
            .iter()
            .any(|m| item.strip_prefix(m).is_some_and(|t| t.starts_with(char::is_whitespace)));
        let open = item.find(['{', ';']).filter(|&b| item.as_bytes()[b] == b'{');
        match open.filter(|_| test_only && is_mod) {
            Some(open) => {
                let start = rest.len() - item.len() + open;
                let mut depth = 0;
                let mut end = rest.len();
                for (k, ch) in rest[start..].char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = start + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                out.extend(rest[pos..end].chars().filter(|&ch| ch == '\n'));
                rest = &rest[end..];
            }
            None => {
                out.push_str("#[cfg(");
                rest = &rest[pos + "#[cfg(".len()..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Skips whitespace and further `#[..]` attributes.
fn skip_attributes(mut s: &str) -> &str {
    loop {
        s = s.trim_start();
        if let Some(t) = s.strip_prefix("#[") {
            let mut depth = 1;
            let mut end = t.len();
            for (k, ch) in t.char_indices() {
                match ch {
                    '[' => depth += 1,
                    ']' => {
                        depth -= 1;
                        if depth == 0 {
                            end = k + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            s = &t[end..];
        } else {
            return s;
        }
    }
}

/// The absolute module paths (as far as they are written) that the code of a file with module path `here`
/// names through `crate::`, `self::` or `super::`, with their line numbers. A `{ .. }` group after the prefix
/// gives one path per element.
fn references(code: &str, here: &[String]) -> Vec<Ref> {
    let tokens = tokenize(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let (line, ref tok) = tokens[i];
        let starts_path = (tok == "crate" || tok == "self" || tok == "super")
            && tokens.get(i + 1).is_some_and(|t| t.1 == "::")
            && !(i > 0 && tokens[i - 1].1 == "::");
        if !starts_path {
            i += 1;
            continue;
        }
        let mut base: Vec<String> = if tok == "crate" { Vec::new() } else { here.to_vec() };
        if tok == "super" {
            base.pop();
        }
        i += 2;
        // Further `super::` segments.
        while tokens.get(i).is_some_and(|t| t.1 == "super") && tokens.get(i + 1).is_some_and(|t| t.1 == "::") {
            base.pop();
            i += 2;
        }
        collect_path(&tokens, &mut i, base, line, &mut out);
    }
    out
}

/// What the parent file of a module directory (`lib.rs`/`main.rs`, `mod.rs` or `dir.rs`) re-exports from
/// its children: each name a `use` brings in (its alias, else its last segment), with the child it is of,
/// so that `crate::Error` counts as a reference to `error` when the crate root says `pub use error::Error`.
fn reexports(parent: &Path, path: &[String], children: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(text) = fs::read_to_string(parent) else { return out };
    let tokens = tokenize(&strip_tests(&strip_comments_and_strings(&text)));
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i].1 != "use" || (i > 0 && tokens[i - 1].1 == "::") {
            i += 1;
            continue;
        }
        i += 1;
        let mut base = path.to_vec();
        match tokens.get(i).map(|t| t.1.as_str()) {
            Some("crate") if tokens.get(i + 1).is_some_and(|t| t.1 == "::") => {
                base.clear();
                i += 2;
            }
            Some("self") if tokens.get(i + 1).is_some_and(|t| t.1 == "::") => i += 2,
            _ => {}
        }
        let mut paths = Vec::new();
        collect_path(&tokens, &mut i, base, 0, &mut paths);
        for r in paths {
            if r.path.len() > path.len() + 1 && r.path[..path.len()] == *path && children.contains(&r.path[path.len()])
            {
                let name = r.alias.or_else(|| r.path.last().cloned()).unwrap_or_default();
                out.insert(name, r.path[path.len()].clone());
            }
        }
    }
    out
}

/// Reads `a::b::{c, d::e as f}` from `tokens[*i]` on, pushing each full path (prefixed with `base`).
fn collect_path(tokens: &[(usize, String)], i: &mut usize, mut base: Vec<String>, line: usize, out: &mut Vec<Ref>) {
    loop {
        match tokens.get(*i) {
            Some((_, t)) if is_ident(t) => {
                base.push(t.clone());
                *i += 1;
                if tokens.get(*i).is_some_and(|t| t.1 == "::") {
                    *i += 1;
                    continue;
                }
                let mut alias = None;
                if tokens.get(*i).is_some_and(|t| t.1 == "as") {
                    alias = tokens.get(*i + 1).map(|t| t.1.clone());
                    *i += 2;
                }
                out.push(Ref { line, path: base, alias });
                return;
            }
            Some((_, t)) if t == "{" => {
                *i += 1;
                loop {
                    match tokens.get(*i) {
                        None => return,
                        Some((_, t)) if t == "}" => {
                            *i += 1;
                            return;
                        }
                        Some((_, t)) if t == "," => *i += 1,
                        Some((l, t)) if t == "self" => {
                            out.push(Ref { line: *l, path: base.clone(), alias: None });
                            *i += 1;
                        }
                        Some((l, _)) => {
                            let before = *i;
                            collect_path(tokens, i, base.clone(), *l, out);
                            // Skip what a path element may carry (`*`).
                            while tokens.get(*i).is_some_and(|t| t.1 != "," && t.1 != "}") {
                                *i += 1;
                            }
                            if *i == before {
                                *i += 1;
                            }
                        }
                    }
                }
            }
            _ => {
                out.push(Ref { line, path: base, alias: None });
                return;
            }
        }
    }
}

fn is_ident(t: &str) -> bool {
    t.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Identifiers (with `r#`), `::` and single punctuation characters, each with its line number.
fn tokenize(code: &str) -> Vec<(usize, String)> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let mut word: String = c[start..i].iter().collect();
            if word == "r" && c.get(i) == Some(&'#') {
                i += 1;
                let s = i;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
                word = c[s..i].iter().collect();
            }
            out.push((line, word));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((line, "::".to_string()));
            i += 2;
        } else {
            out.push((line, ch.to_string()));
            i += 1;
        }
    }
    out
}

/// One shortest cycle through each strongly connected component of more than one module, written as
/// `[a, b, .., a]`, with the component's other modules.
fn cycles(edges: &Edges) -> Vec<(Vec<String>, Vec<String>)> {
    let nodes: BTreeSet<&String> = edges.keys().chain(edges.values().flat_map(|m| m.keys())).collect();
    let mut found = Vec::new();
    let mut done: BTreeSet<String> = BTreeSet::new();
    for &start in &nodes {
        if done.contains(start) {
            continue;
        }
        // The modules that reach back to `start` and that `start` reaches: its component.
        let fwd = reach(edges, start, false);
        let back = reach(edges, start, true);
        let comp: BTreeSet<String> = fwd.intersection(&back).cloned().collect();
        done.extend(comp.iter().cloned());
        if comp.len() < 2 {
            continue;
        }
        // A shortest path from `start` back to itself inside the component (breadth first).
        let mut prev: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.clone()]);
        'bfs: while let Some(n) = queue.pop_front() {
            for next in edges.get(&n).into_iter().flat_map(|m| m.keys()) {
                if !comp.contains(next) {
                    continue;
                }
                if next == start {
                    prev.insert(start.clone(), n.clone());
                    break 'bfs;
                }
                if !prev.contains_key(next) {
                    prev.insert(next.clone(), n.clone());
                    queue.push_back(next.clone());
                }
            }
        }
        let mut cycle = vec![start.clone()];
        let mut at = prev[start].clone();
        while at != *start {
            cycle.push(at.clone());
            at = prev[&at].clone();
        }
        cycle.push(start.clone());
        cycle.reverse();
        let others: Vec<String> = comp.iter().filter(|m| !cycle.contains(m)).cloned().collect();
        found.push((cycle, others));
    }
    found
}

fn reach(edges: &Edges, start: &str, backwards: bool) -> BTreeSet<String> {
    let mut seen = BTreeSet::from([start.to_string()]);
    let mut stack = vec![start.to_string()];
    while let Some(n) = stack.pop() {
        let nexts: Vec<String> = if backwards {
            edges.iter().filter(|(_, m)| m.contains_key(&n)).map(|(k, _)| k.clone()).collect()
        } else {
            edges.get(&n).map(|m| m.keys().cloned().collect()).unwrap_or_default()
        };
        for next in nexts {
            if seen.insert(next.clone()) {
                stack.push(next);
            }
        }
    }
    seen
}
