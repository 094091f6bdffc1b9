//! The layers of docs/architecture.md hold: every `crate::` path in `src/` names a module of
//! the same layer or one below, and only the program's edge (`load`) and the test harness name
//! a concrete device.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// Top-level modules of `src/` from the bottom layer up (`docs/architecture.md`).
const LAYERS: &[&[&str]] = &[
    &["data", "interleave", "error", "options", "progress"],
    &["dict", "device", "parallel", "step", "step_passes"],
    &["executor"],
    &["devices"],
    &["ops", "tokenizer"],
    &["model"],
    &["format", "convert"],
    &["generate", "load", "default_model"],
    &["ffi"],
    &["harness"],
];

/// Modules that may name `crate::devices` besides the devices themselves.
const DEVICE_BUILDERS: &[&str] = &["load", "harness"];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level modules `text` names through `crate::` (plain paths and `use crate::{a, b}`,
/// a group may span lines), outside comments and the file's unit-test module (from its
/// `#[cfg(test)] mod` on), with the line number of each `crate::`.
fn crate_refs(text: &str) -> Vec<(usize, String)> {
    let lines = library_lines(text);
    let code: String = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
    let line_at = |at: usize| lines[code[..at].matches('\n').count()].0;
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = code[from..].find("crate::") {
        let at = from + found;
        from = at + "crate::".len();
        let rest = &code[from..];
        let n = line_at(at);
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::b, c}`: the names at the group's top level
            let mut depth = 0;
            let mut name = String::new();
            let mut take = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if !name.is_empty() {
                            out.push((n, std::mem::take(&mut name)));
                        }
                        take = true;
                    }
                    c if depth == 0 && take && (c.is_alphanumeric() || c == '_') => name.push(c),
                    c if depth == 0 && !c.is_whitespace() => take = false,
                    _ => {}
                }
            }
            if !name.is_empty() {
                out.push((n, name));
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push((n, name));
            }
        }
    }
    out
}

/// The items `lib.rs` re-exports at the crate root (`pub use data::{Data, DataType};`), each with
/// the top-level module it comes from.
fn root_reexports(lib: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in lib.lines() {
        let Some(path) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let path = path.trim_end_matches(';');
        let module = path.split("::").next().unwrap_or("").to_string();
        let items = match (path.find('{'), path.rfind('}')) {
            (Some(a), Some(b)) => path[a + 1..b].to_string(),
            _ => path.rsplit("::").next().unwrap_or("").to_string(),
        };
        for item in items.split(',') {
            // `a as b` exports `b`
            let name = item.rsplit(" as ").next().unwrap_or("").trim();
            if !name.is_empty() {
                out.push((name.to_string(), module.clone()));
            }
        }
    }
    out
}

/// The lines of `text` outside comments and before its unit-test module (the part of a file
/// that is library code), with their numbers.
fn library_lines(text: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        // the attributes after `#[cfg(test)]` (such as `#[path = "…"]`), then `mod`
        let next = lines[n + 1..]
            .iter()
            .map(|l| l.trim())
            .find(|l| !l.starts_with("#["))
            .unwrap_or("");
        if line.trim() == "#[cfg(test)]" && next.starts_with("mod ") {
            break;
        }
        out.push((n + 1, line.split("//").next().unwrap_or("")));
    }
    out
}

#[test]
fn imports_point_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let reexports = root_reexports(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut wrong = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" {
            continue;
        }
        let Some(mine) = layer(&module) else {
            wrong.push(format!(
                "{}: module '{module}' is in no layer of this test",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap();
        for (line, name) in crate_refs(&text) {
            // a re-export of the crate root (`crate::Result`) counts as the module it comes from
            let used = match reexports.iter().find(|(item, _)| *item == name) {
                Some((_, from)) => from.clone(),
                None => name,
            };
            let Some(theirs) = layer(&used) else {
                wrong.push(format!(
                    "{}:{line}: crate::{used} is neither a module in a layer nor a re-export",
                    rel.display()
                ));
                continue;
            };
            if theirs > mine {
                wrong.push(format!(
                    "{}:{line}: {module} (layer {mine}) uses {used} (layer {theirs})",
                    rel.display()
                ));
            }
            if used == "devices"
                && module != "devices"
                && !DEVICE_BUILDERS.contains(&module.as_str())
            {
                wrong.push(format!(
                    "{}:{line}: {module} names a concrete device (only {DEVICE_BUILDERS:?} may)",
                    rel.display()
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_reference_parser_sees_groups_and_skips_comments() {
    let refs = crate_refs(
        "use crate::{data::Data, model::{Model, W}, ops};\n// crate::ffi\nlet x = crate::load::f();\n#[cfg(test)]\nmod tests {\nuse crate::harness;",
    );
    let names: Vec<&str> = refs.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["data", "model", "ops", "load"]);
    let refs = crate_refs("use crate::{\n    data::{Data, DataType},\n    model::Model,\n};\n");
    assert_eq!(refs, [(1, "data".to_string()), (1, "model".to_string())]);
}

#[test]
fn the_root_reexports_are_traced_to_their_modules() {
    let got = root_reexports(
        "pub mod data;\npub use data::{Data, DataType};\npub use error::Result;\npub use x::Y as Z;",
    );
    let want = [
        ("Data", "data"),
        ("DataType", "data"),
        ("Result", "error"),
        ("Z", "x"),
    ];
    let got: Vec<(&str, &str)> = got.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    assert_eq!(got, want);
}

/// Environment variables are read in one place, `src/options.rs` (`RuntimeOptions::from_env`);
/// the rest of the library (`src/`, `cpu/src/`) takes typed options. The CLI and the server
/// (`tools/`) are the program's edge and may read their own.
#[test]
fn only_the_options_module_reads_the_environment() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("cpu").join("src"), &mut files);
    files.sort();
    let allowed = root.join("src").join("options.rs");
    assert!(allowed.exists(), "{} is missing", allowed.display());
    let mut wrong = Vec::new();
    for f in files.iter().filter(|f| **f != allowed) {
        let text = std::fs::read_to_string(f).unwrap();
        for (line, code) in library_lines(&text) {
            if ["env::var", "env::vars", "getenv"]
                .iter()
                .any(|w| code.contains(w))
            {
                wrong.push(format!(
                    "{}:{line}: {}",
                    f.strip_prefix(root).unwrap().display(),
                    code.trim()
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "environment reads outside src/options.rs:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn library_lines_stop_at_the_unit_tests_and_drop_comments() {
    let text = "let a = 1; // env::var\n#[cfg(test)]\nmod tests {\nstd::env::var(\"X\");";
    let got = library_lines(text);
    assert_eq!(got, [(1, "let a = 1; ")]);
}

/// A module of `src/` by its path from the crate root (`["model", "paged"]`; the root is `[]`).
type ModPath = Vec<String>;

/// The module a file under `src/` holds (`model/paged.rs` and `model/paged/mod.rs` are
/// `model::paged`, `lib.rs` the root).
fn module_of(rel: &Path) -> ModPath {
    let mut parts: ModPath = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().unwrap_or_default();
    let stem = file.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// One path of a `use` tree or of code, groups expanded, and the name it brings into scope
/// (its last segment, or the name after `as`).
#[derive(Debug, PartialEq)]
struct UsePath {
    path: Vec<String>,
    name: String,
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn ident_at(code: &str, at: usize) -> &str {
    let len = code.as_bytes()[at..]
        .iter()
        .take_while(|&&c| is_ident(c))
        .count();
    &code[at..at + len]
}

fn skip_ws(code: &str, mut at: usize) -> usize {
    let b = code.as_bytes();
    while at < b.len() && b[at].is_ascii_whitespace() {
        at += 1;
    }
    at
}

/// Reads the path tree starting at `at` (`a::b::{c, d::{e as f}, self}`) below `prefix` into
/// `out`; returns the offset after it.
fn path_tree(code: &str, mut at: usize, prefix: &[String], out: &mut Vec<UsePath>) -> usize {
    let b = code.as_bytes();
    let mut path = prefix.to_vec();
    let mut took = false;
    loop {
        at = skip_ws(code, at);
        if at >= b.len() {
            break;
        }
        if b[at] == b'{' {
            at += 1;
            loop {
                at = skip_ws(code, at);
                match b.get(at) {
                    None => return at,
                    Some(b'}') => return at + 1,
                    Some(b',') => at += 1,
                    Some(_) => {
                        let end = path_tree(code, at, &path, out);
                        at = if end == at { at + 1 } else { end };
                    }
                }
            }
        }
        if b[at] == b'*' {
            // a glob names the module itself
            let name = path.last().cloned().unwrap_or_default();
            out.push(UsePath { path, name });
            return at + 1;
        }
        let word = ident_at(code, at);
        if word.is_empty() {
            break;
        }
        at += word.len();
        took = true;
        // `self` inside a group is the group's module
        if word != "self" || path.is_empty() {
            path.push(word.to_string());
        }
        let after = skip_ws(code, at);
        if code[after..].starts_with("::") {
            at = after + 2;
            continue;
        }
        break;
    }
    if !took {
        return at;
    }
    let mut name = path.last().cloned().unwrap_or_default();
    let after = skip_ws(code, at);
    if ident_at(code, after) == "as" {
        let alias_at = skip_ws(code, after + 2);
        name = ident_at(code, alias_at).to_string();
        at = alias_at + name.len();
    }
    out.push(UsePath { path, name });
    at
}

/// Every path in `code` that starts at `crate::`, `super::` or `self::` (in `use` items and in
/// expressions and types alike), with groups expanded, each with the offset where it starts.
fn rooted_paths(code: &str) -> Vec<(usize, UsePath)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        if !is_ident(b[at]) {
            at += 1;
            continue;
        }
        let word = ident_at(code, at);
        let joined = at > 0 && (is_ident(b[at - 1]) || b[at - 1] == b':' || b[at - 1] == b'#');
        if !joined
            && matches!(word, "crate" | "super" | "self")
            && code[at + word.len()..].starts_with("::")
        {
            let mut paths = Vec::new();
            let end = path_tree(code, at, &[], &mut paths);
            out.extend(paths.into_iter().map(|p| (at, p)));
            at = end.max(at + word.len());
        } else {
            at += word.len();
        }
    }
    out
}

/// The library code of one module: its text without comments and unit tests.
struct ModuleCode {
    file: PathBuf,
    /// (line number, line) of the library code
    lines: Vec<(usize, String)>,
    code: String,
}

impl ModuleCode {
    fn line_at(&self, at: usize) -> usize {
        self.lines[self.code[..at].matches('\n').count()].0
    }

    /// The names this module re-exports (`pub use …`), each with the path it stands for
    /// (made absolute where it starts at a child module, as `pub use data::Data` does in
    /// `lib.rs`).
    fn reexports(&self, me: &[String], modules: &BTreeSet<ModPath>) -> Vec<UsePath> {
        let mut out = Vec::new();
        let mut from = 0;
        while let Some(found) = self.code[from..].find("pub use ") {
            let at = from + found + "pub use ".len();
            let mut paths = Vec::new();
            from = path_tree(&self.code, at, &[], &mut paths).max(at);
            for mut p in paths {
                let first = p.path[0].as_str();
                if !matches!(first, "crate" | "super" | "self") {
                    let child: ModPath = me.iter().cloned().chain([first.to_string()]).collect();
                    if !modules.contains(&child) {
                        continue; // another crate's item
                    }
                    p.path.insert(0, "self".to_string());
                }
                out.push(p);
            }
        }
        out
    }
}

/// The module graph of `src/`: which module's library code names which other module (through
/// `crate::`, `super::` and `self::` paths, re-exports followed to the module that defines the
/// item). A module and its own ancestors are not edges: a parent declares and re-exports its
/// children, and children use what their parent holds.
struct ModuleGraph {
    modules: BTreeMap<ModPath, ModuleCode>,
    /// (module, name) → the path the name re-exports
    reexports: HashMap<(ModPath, String), (ModPath, Vec<String>)>,
}

impl ModuleGraph {
    fn read(src: &Path) -> ModuleGraph {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        let mut modules = BTreeMap::new();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let lines: Vec<(usize, String)> = library_lines(&text)
                .into_iter()
                .map(|(n, l)| (n, l.to_string()))
                .collect();
            let code = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
            let m = module_of(f.strip_prefix(src).unwrap());
            modules.insert(
                m,
                ModuleCode {
                    file: f,
                    lines,
                    code,
                },
            );
        }
        // files that only unit tests include (`#[cfg(test)] #[path = "x_tests.rs"] mod tests;`)
        let test_files: Vec<PathBuf> = modules
            .values()
            .flat_map(|m| {
                let text = std::fs::read_to_string(&m.file).unwrap();
                let dir = m.file.parent().unwrap().to_path_buf();
                text.lines()
                    .skip(m.lines.len())
                    .filter_map(|l| l.trim().strip_prefix("#[path = \""))
                    .map(|l| dir.join(l.trim_end_matches("\"]")))
                    .collect::<Vec<_>>()
            })
            .collect();
        modules.retain(|_, m| !test_files.contains(&m.file));
        let names: BTreeSet<ModPath> = modules.keys().cloned().collect();
        let mut reexports = HashMap::new();
        for (m, code) in &modules {
            for p in code.reexports(m, &names) {
                reexports.insert((m.clone(), p.name), (m.clone(), p.path));
            }
        }
        ModuleGraph { modules, reexports }
    }

    /// The module a path used in module `cur` names: the longest prefix that is a module, or
    /// the module a re-exported name comes from.
    fn resolve(&self, cur: &[String], path: &[String], depth: usize) -> Option<ModPath> {
        let (first, mut rest) = path.split_first()?;
        let mut m: ModPath = match first.as_str() {
            "crate" => Vec::new(),
            "self" => cur.to_vec(),
            "super" => cur.split_last()?.1.to_vec(),
            _ => return None,
        };
        while let Some((s, more)) = rest.split_first() {
            if s != "super" {
                break;
            }
            m.pop();
            rest = more;
        }
        for seg in rest {
            let mut next = m.clone();
            next.push(seg.clone());
            if self.modules.contains_key(&next) {
                m = next;
                continue;
            }
            if depth < 8 {
                if let Some((at, to)) = self.reexports.get(&(m.clone(), seg.clone())) {
                    return self.resolve(at, to, depth + 1);
                }
            }
            break;
        }
        Some(m)
    }

    /// Every edge `from → to` with the file and line of one path that makes it.
    fn edges(&self) -> BTreeMap<(ModPath, ModPath), String> {
        let mut out = BTreeMap::new();
        for (m, code) in &self.modules {
            for (at, p) in rooted_paths(&code.code) {
                let Some(to) = self.resolve(m, &p.path, 0) else {
                    continue;
                };
                if to.starts_with(m) || m.starts_with(&to) {
                    continue;
                }
                out.entry((m.clone(), to)).or_insert_with(|| {
                    let rel = code.file.iter().skip_while(|c| *c != "src");
                    let rel: PathBuf = rel.collect();
                    format!("{}:{}", rel.display(), code.line_at(at))
                });
            }
        }
        out
    }
}

/// The strongly connected components of more than one module (Tarjan's algorithm).
fn cycles(edges: &BTreeMap<(ModPath, ModPath), String>) -> Vec<Vec<ModPath>> {
    struct Walk<'a> {
        next: BTreeMap<&'a ModPath, Vec<&'a ModPath>>,
        index: HashMap<&'a ModPath, usize>,
        low: HashMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        out: Vec<Vec<ModPath>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a ModPath) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            for w in self.next.get(v).cloned().unwrap_or_default() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let l = self.low[v].min(self.low[w]);
                    self.low.insert(v, l);
                } else if self.stack.contains(&w) {
                    let l = self.low[v].min(self.index[w]);
                    self.low.insert(v, l);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    comp.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut walk = Walk {
        next: BTreeMap::new(),
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for (a, b) in edges.keys() {
        walk.next.entry(a).or_default().push(b);
    }
    let starts: Vec<&ModPath> = walk.next.keys().copied().collect();
    for v in starts {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.out
}

/// The edges between the modules `depth` levels below the root that hold the ends of `edges`
/// (`model::paged → model::transformer` is no edge at depth 1, `format::info → convert` is
/// `format → convert`).
fn at_depth(
    edges: &BTreeMap<(ModPath, ModPath), String>,
    depth: usize,
) -> BTreeMap<(ModPath, ModPath), String> {
    let mut out = BTreeMap::new();
    for ((a, b), at) in edges {
        let a: ModPath = a.iter().take(depth).cloned().collect();
        let b: ModPath = b.iter().take(depth).cloned().collect();
        if !a.starts_with(&b) && !b.starts_with(&a) {
            out.entry((a, b)).or_insert_with(|| at.clone());
        }
    }
    out
}

#[test]
fn no_module_imports_itself_through_others() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = ModuleGraph::read(&src);
    let all = graph.edges();
    let deepest = graph.modules.keys().map(Vec::len).max().unwrap_or(0);
    let mut wrong = Vec::new();
    let mut seen = BTreeSet::new();
    for depth in 1..=deepest {
        let edges = at_depth(&all, depth);
        for comp in cycles(&edges) {
            if seen.insert(comp.clone()) {
                report_cycle(&comp, &edges, &mut wrong);
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "modules that import each other (move what both use to a module below them):\n{}",
        wrong.join("\n")
    );
}

/// Lines naming the modules of one circle and the edges between them.
fn report_cycle(
    comp: &[ModPath],
    edges: &BTreeMap<(ModPath, ModPath), String>,
    wrong: &mut Vec<String>,
) {
    let show = |m: &ModPath| format!("crate::{}", m.join("::"));
    let names: Vec<String> = comp.iter().map(show).collect();
    wrong.push(format!("circle: {}", names.join(", ")));
    for ((a, b), at) in edges {
        if comp.contains(a) && comp.contains(b) {
            wrong.push(format!("    {} -> {} ({at})", show(a), show(b)));
        }
    }
}

#[test]
fn the_path_reader_expands_nested_groups() {
    let got = rooted_paths(
        "use super::{a::{b, c as d}, e::{self, f::*}};\nlet x = self::g::h(); let y = mycrate::z; x.self_y;\nsuper::super::k::<T>::new()",
    );
    let got: Vec<(String, &str)> = got
        .iter()
        .map(|(_, p)| (p.path.join("::"), p.name.as_str()))
        .collect();
    let want = [
        ("super::a::b", "b"),
        ("super::a::c", "d"),
        ("super::e", "e"),
        ("super::e::f", "f"),
        ("self::g::h", "h"),
        ("super::super::k", "k"),
    ];
    let want: Vec<(String, &str)> = want.iter().map(|(a, b)| (a.to_string(), *b)).collect();
    assert_eq!(got, want);
}

#[test]
fn the_cycle_finder_reports_only_circles() {
    let m = |s: &str| -> ModPath { s.split("::").map(str::to_string).collect() };
    let mut edges = BTreeMap::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e")] {
        edges.insert((m(a), m(b)), String::new());
    }
    assert_eq!(cycles(&edges), vec![vec![m("a"), m("b"), m("c")]]);
    edges.remove(&(m("c"), m("a")));
    assert!(cycles(&edges).is_empty());
}
