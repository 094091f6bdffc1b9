//! The layers of docs/architecture.md hold: every `crate::` path in `src/` names a module of
//! the same layer or one below, and only the program's edge (`load`) and the test harness name
//! a concrete device.

use std::path::{Path, PathBuf};

/// Top-level modules of `src/` from the bottom layer up (`docs/architecture.md`).
const LAYERS: &[&[&str]] = &[
    &["data", "interleave", "error", "options", "progress"],
    &["device", "parallel", "step"],
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
        let next = lines.get(n + 1).map_or("", |l| l.trim());
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
