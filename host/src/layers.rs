//! The layer check: every module imports only modules on its own floor or
//! below, as the "Layers" list in the crate docs (`lib.rs`) orders them,
//! the modules of one floor import each other without a circle, and each
//! module's own `//!` names the floor lib.rs puts it on.
//!
//! It reads the sources as text, the way `shared/tools/modgraph.py` does:
//! a module's imports are the `crate::` paths (`crate::a::B`, and every
//! member of a `crate::{a::B, c}` group) in its files, leaving out
//! comments, test files (`tests.rs`, `tests/`) and `#[cfg(test)]` items.
//! A hand-made reader, since no crate checks layering of modules inside
//! one crate; `syn` would parse more exactly, but a path in a macro body or
//! a string is rare here and would be caught by the review of the diff.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The floors, bottom first, as the crate docs list them.
fn floors(lib: &str) -> Vec<BTreeSet<String>> {
    let mut floors = Vec::new();
    let mut in_layers = false;
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            break;
        };
        let doc = doc.trim();
        if doc.starts_with("# ") {
            in_layers = doc == "# Layers";
            continue;
        }
        let numbered = doc
            .split_once(". ")
            .filter(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if let (true, Some((number, rest))) = (in_layers, numbered) {
            assert_eq!(
                number.parse::<usize>().unwrap(),
                floors.len() + 1,
                "the floors are numbered 1, 2, … in lib.rs"
            );
            let names = rest
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect::<BTreeSet<_>>();
            assert!(!names.is_empty(), "floor {number} names no module");
            floors.push(names);
        }
    }
    floors
}

/// Every `.rs` file under `dir`, but test files.
pub(crate) fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().unwrap() != "tests" {
                sources(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().unwrap() != "tests.rs"
        {
            out.push(path);
        }
    }
}

/// `text` without full-line comments and `#[cfg(test)]` items.
pub(crate) fn code(text: &str) -> String {
    let text: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        rest = &rest[at + "#[cfg(test)]".len()..];
        // The item ends at its first `;` unless a `{` comes first, then at
        // the matching `}`.
        let semi = rest.find(';').unwrap_or(rest.len());
        let brace = rest.find('{').unwrap_or(rest.len());
        if semi < brace {
            rest = &rest[(semi + 1).min(rest.len())..];
            continue;
        }
        rest = &rest[block_end(rest, brace)..];
    }
    out.push_str(rest);
    out
}

/// Where the block opening at byte `open` of `text` ends (just past its
/// matching `}`; the text's end if it has none). Braces inside string and
/// char literals (`"}"`, `r#"{"#`, `'{'`) do not count.
fn block_end(text: &str, open: usize) -> usize {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            b'"' => i = string_end(bytes, i, 0),
            b'r' if matches!(bytes.get(i + 1), Some(b'"' | b'#')) => {
                let hashes = bytes[i + 1..].iter().take_while(|&&b| b == b'#').count();
                if bytes.get(i + 1 + hashes) == Some(&b'"') {
                    i = string_end(bytes, i + 1 + hashes, hashes);
                }
            }
            // A char literal ('{', '\''), not a lifetime ('a).
            b'\'' if bytes.get(i + 2) == Some(&b'\'') => i += 2,
            b'\'' if bytes.get(i + 1) == Some(&b'\\') => {
                let close = bytes
                    .get(i + 3..)
                    .and_then(|r| r.iter().position(|&b| b == b'\''));
                i += close.map_or(0, |p| p + 3);
            }
            _ => {}
        }
        i += 1;
    }
    text.len()
}

/// The index of the `"` that closes the string opening at `open` (a raw
/// string with `hashes` `#`s when `hashes > 0` or when it began `r"`).
fn string_end(bytes: &[u8], open: usize, hashes: usize) -> usize {
    let raw = hashes > 0 || (open > 0 && bytes[open - 1] == b'r');
    let mut i = open + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if !raw => i += 1,
            b'"' if bytes
                .get(i + 1..=i + hashes)
                .is_some_and(|h| h.iter().all(|&b| b == b'#')) =>
            {
                return i + hashes;
            }
            _ => {}
        }
        i += 1;
    }
    bytes.len()
}

/// The top-level modules `code` names through `crate::` paths.
fn imports(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        if code[..at].ends_with('$') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Split the group's top level at commas.
            let mut depth = 0usize;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        found.insert(ident(group[start..i].trim()));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.insert(ident(group[start..i].trim()));
                        start = i + 1;
                    }
                    _ => {}
                }
            }
        } else {
            found.insert(ident(rest));
        }
    }
    found.retain(|m| !m.is_empty() && m != "self");
    found
}

/// Which top-level module imports which, from the sources under `src`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let first = relative.components().next().unwrap();
        let top = first.as_os_str().to_str().unwrap().trim_end_matches(".rs");
        // The crate's root, the binary, and the two test-only checks of
        // the codebase itself (this one, and the book's against the code).
        if top == "lib" || top == "main" || top == "layers" || top == "book" {
            continue;
        }
        let deps = imports(&code(&std::fs::read_to_string(&file).unwrap()));
        let entry = graph.entry(top.to_owned()).or_default();
        entry.extend(deps.into_iter().filter(|d| d != top));
    }
    graph
}

/// The circles among `modules` in `graph` (Tarjan's strongly connected
/// components of more than one module).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.graph.contains_key(w) {
                    continue;
                }
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.out.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.out
}

/// Every way `graph` breaks `floors`: an unlisted module, a listed module
/// that does not exist, an import of a higher floor, a circle.
fn violations(
    graph: &BTreeMap<String, BTreeSet<String>>,
    floors: &[BTreeSet<String>],
) -> Vec<String> {
    let floor_of = |m: &str| floors.iter().position(|f| f.contains(m));
    let mut out = Vec::new();
    for (module, deps) in graph {
        let Some(mine) = floor_of(module) else {
            out.push(format!(
                "module `{module}` is on no floor of lib.rs's \"Layers\""
            ));
            continue;
        };
        for dep in deps {
            if let Some(theirs) = floor_of(dep).filter(|&f| f > mine) {
                out.push(format!(
                    "`{module}` (floor {}) imports `{dep}` (floor {}), a floor above it",
                    mine + 1,
                    theirs + 1
                ));
            }
        }
    }
    for floor in floors {
        for module in floor.iter().filter(|m| !graph.contains_key(*m)) {
            out.push(format!(
                "lib.rs's \"Layers\" lists `{module}`, which is no module"
            ));
        }
    }
    for circle in circles(graph) {
        out.push(format!("a circle of imports: {}", circle.join(", ")));
    }
    out
}

/// Every way the modules' own docs disagree with `floors`: each
/// top-level module's `//!` says `Floor N` for the floor lib.rs puts it on.
fn docs_disagreeing(src: &Path, floors: &[BTreeSet<String>]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, floor) in floors.iter().enumerate() {
        for module in floor {
            let Ok(text) = std::fs::read_to_string(src.join(format!("{module}.rs"))) else {
                continue;
            };
            let doc: String = text
                .lines()
                .take_while(|l| l.starts_with("//!"))
                .collect::<Vec<_>>()
                .join(" ");
            let said = doc
                .split("Floor ")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse::<usize>().ok());
            match said {
                Some(n) if n == i + 1 => {}
                Some(n) => out.push(format!(
                    "the docs of `{module}` say floor {n}, lib.rs puts it on floor {}",
                    i + 1
                )),
                None => out.push(format!("the docs of `{module}` do not say its floor")),
            }
        }
    }
    out
}

#[test]
fn every_module_says_its_floor_as_lib_rs_does() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let floors = floors(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let found = docs_disagreeing(&src, &floors);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn every_module_imports_only_its_floor_and_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let floors = floors(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    assert!(
        floors.len() > 5,
        "lib.rs lists its floors under \"# Layers\""
    );
    let found = violations(&graph(&src), &floors);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The check itself can fail: an upward import, a circle within a floor,
/// an unlisted module, and the `crate::` forms it must read.
#[test]
fn the_check_sees_upward_imports_circles_and_unlisted_modules() {
    let floors = floors(
        "//! # Layers\n//! text\n//!\n//! 1. ground: `a`, `b`\n//! 2. top: `c`\n//!\n//! # Other\n//! 3. `x`\n",
    );
    assert_eq!(floors.len(), 2);
    let graph = |edges: &[(&str, &[&str])]| {
        edges
            .iter()
            .map(|(m, d)| (m.to_string(), d.iter().map(|s| s.to_string()).collect()))
            .collect::<BTreeMap<_, BTreeSet<_>>>()
    };
    let ok = graph(&[("a", &["b"]), ("b", &[]), ("c", &["a", "b"])]);
    assert_eq!(violations(&ok, &floors), Vec::<String>::new());
    let upward = graph(&[("a", &["c"]), ("b", &[]), ("c", &[])]);
    assert_eq!(
        violations(&upward, &floors),
        ["`a` (floor 1) imports `c` (floor 2), a floor above it"]
    );
    let circle = graph(&[("a", &["b"]), ("b", &["a"]), ("c", &[])]);
    assert_eq!(violations(&circle, &floors), ["a circle of imports: a, b"]);
    let unlisted = graph(&[("a", &[]), ("b", &[]), ("c", &[]), ("d", &[])]);
    assert_eq!(
        violations(&unlisted, &floors),
        ["module `d` is on no floor of lib.rs's \"Layers\""]
    );

    let text = "use crate::a::X;\n\
                // crate::gone\n\
                use crate::{b::{Y, Z}, c, self};\n\
                fn f() { crate::d::f(); }\n\
                #[cfg(test)]\nmod tests { use crate::e; }\n\
                #[cfg(test)]\nuse crate::f;\n\
                macro_rules! m { () => { $crate::g } }\n";
    assert_eq!(
        imports(&code(text)).into_iter().collect::<Vec<_>>(),
        ["a", "b", "c", "d"]
    );
}

/// A test item ends at its own closing brace, whatever braces its string
/// and char literals hold, so the code after it is still read.
#[test]
fn test_items_end_at_their_brace_not_at_one_in_a_literal() {
    let text = "use crate::a::X;\n\
                #[cfg(test)]\n\
                mod tests {\n\
                    fn f<'a>(s: &'a str) { let _ = (\"}\", '{', '\\'', '\\u{7b}', r#\"}\"#, r\"{\"); }\n\
                    use crate::hidden::Y;\n\
                }\n\
                use crate::b::Z;\n";
    let kept = code(text);
    assert!(kept.contains("crate::b::Z"), "{kept}");
    assert!(!kept.contains("crate::hidden"), "{kept}");
    assert_eq!(
        imports(&kept).into_iter().collect::<Vec<_>>(),
        vec!["a".to_owned(), "b".to_owned()]
    );
}
