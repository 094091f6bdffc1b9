//! The layers of docs/architecture.md hold: every `crate::` path in `src/` names a module of
//! the same layer or one below, and only the program's edge (`load`) and the test harness name
//! a concrete device.

use std::path::{Path, PathBuf};

/// Top-level modules of `src/` from the bottom layer up (`docs/architecture.md`).
const LAYERS: &[&[&str]] = &[
    &["data", "interleave", "error", "options"],
    &["device", "parallel"],
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

/// The top-level modules `text` names through `crate::` (plain paths and `use crate::{a, b}`),
/// outside comments and the file's unit-test module (from its `#[cfg(test)] mod` on), with its
/// line number.
fn crate_refs(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        let next = lines.get(n + 1).map_or("", |l| l.trim());
        if line.trim() == "#[cfg(test)]" && next.starts_with("mod ") {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `crate::{a::b, c}`: the names at the group's top level (first line only)
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
                                out.push((n + 1, std::mem::take(&mut name)));
                            }
                            take = true;
                        }
                        c if depth == 0 && take && (c.is_alphanumeric() || c == '_') => {
                            name.push(c)
                        }
                        c if depth == 0 && !c.is_whitespace() => take = false,
                        _ => {}
                    }
                }
                if !name.is_empty() {
                    out.push((n + 1, name));
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push((n + 1, name));
                }
            }
        }
    }
    out
}

#[test]
fn imports_point_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
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
        for (line, used) in crate_refs(&text) {
            let Some(theirs) = layer(&used) else {
                // re-exports of the crate root (`crate::Result`, `crate::Data`, …)
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
}
