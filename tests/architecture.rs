//! The arrows of the architecture, checked on the source: the transport (`server`) uses
//! the policy (`service`), which uses the `engine`, which uses the `store`, with `config`
//! beside: `config` and `store` use nothing of `engine`, `service` or `server`, `engine`
//! nothing of `service` or `server`, `service` nothing of `server`, `support` nothing
//! but itself; and no two files use
//! each other, directly or round a loop (a module's own children aside: a parent
//! declares them, and they may use what it holds).
//!
//! A file's uses are the `crate::`, `super::` and `self::` paths in its non-test code
//! (the file less its test-gated items, wherever they are), resolved to the longest
//! module they name.
//!
//! And three house rules the same reading keeps: a module with children defines no type
//! they use (its file is their table of contents), no function outside tests is longer
//! than [`MAX_FUNCTION_LINES`], and no file (tests included) longer than
//! [`MAX_FILE_LINES`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Module = String;

/// Every module of `src/` (`a::b` for `src/a/b.rs` or `src/a/b/mod.rs`) and its source
/// up to its unit tests.
fn modules() -> BTreeMap<Module, String> {
    fn walk(dir: &Path, out: &mut BTreeMap<Module, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix("src").unwrap().with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if parts.last().is_some_and(|p| p == "mod") {
                    parts.pop();
                }
                let name = match parts.join("::").as_str() {
                    "lib" => String::new(),
                    "main" => "<main>".to_string(),
                    n => n.to_string(),
                };
                let source = std::fs::read_to_string(&path).unwrap();
                let non_test = without_test_items(&source);
                // Comments mention paths too; only code counts.
                let code = non_test
                    .lines()
                    .map(|l| l.split("//").next().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join("\n");
                out.insert(name, code);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(Path::new("src"), &mut out);
    out
}

/// `source` with each test-gated item blanked (its `#[cfg(test)]`, the attributes after
/// it and the item: to its `;`, or to the brace closing its block at the attribute's
/// indentation), every other line kept where it was. Only what tests alone compile is
/// left out: code after a `#[cfg(test)] use` or a test helper is read like any other.
fn without_test_items(source: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let mut kept: Vec<&str> = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let Some(rest) = trimmed.strip_prefix("#[cfg(test)]") else {
            kept.push(lines[i]);
            i += 1;
            continue;
        };
        let indent = lines[i].len() - trimmed.len();
        // The item starts on the attribute's line (`#[cfg(test)] mod tests;`) or after
        // it, past any further attributes.
        let mut start = i;
        if rest.trim().is_empty() {
            start += 1;
            while start < lines.len() && lines[start].trim_start().starts_with("#[") {
                start += 1;
            }
        }
        // rustfmt puts a block's closing brace at its opening line's indentation.
        let close = format!("{}}}", " ".repeat(indent));
        let mut end = start;
        let mut opened = false;
        while end < lines.len() {
            let t = lines[end].split("//").next().unwrap_or_default().trim_end();
            let one_line = end == start && t.matches('{').count() == t.matches('}').count();
            opened |= t.contains('{');
            if !opened && t.ends_with(';') {
                break;
            }
            if opened && (t == close || t == format!("{close};") || (one_line && t.ends_with('}')))
            {
                break;
            }
            end += 1;
        }
        kept.extend(std::iter::repeat_n("", end.min(lines.len() - 1) + 1 - i));
        i = end + 1;
    }
    kept.join("\n")
}

/// The paths a source mentions from `crate`, `super` or `self`, use trees expanded
/// (`use super::{a, b::c}` gives `super::a` and `super::b::c`).
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // Use declarations start a line: `use`, `pub use`, `pub(crate) use`, ...
    let mut at = 0;
    for line in code.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let decl = trimmed
            .strip_prefix("use ")
            .or_else(|| trimmed.split_once(") use ").map(|(_, t)| t))
            .or_else(|| trimmed.strip_prefix("pub use "));
        if let Some(tree) = decl {
            let start = at + (line.len() - tree.len());
            if let Some(end) = code[start..].find(';') {
                expand(&code[start..start + end], &mut Vec::new(), &mut out);
            }
        }
        at += line.len();
    }
    // Paths written inline, e.g. `crate::support::text::quote(..)`.
    let bytes = code.as_bytes();
    for root in ["crate::", "super::"] {
        for (i, _) in code.match_indices(root) {
            if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') {
                continue;
            }
            let tail: String = code[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.push(segments(&tail));
        }
    }
    out.retain(|p| {
        matches!(
            p.first().map(String::as_str),
            Some("crate" | "super" | "self")
        )
    });
    out
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Expands one use tree under `prefix`.
fn expand(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    match tree.find('{') {
        None => {
            let name = tree.split(" as ").next().unwrap_or_default();
            let mut path = prefix.clone();
            path.extend(segments(name));
            out.push(path);
        }
        Some(open) => {
            let head = segments(&tree[..open]);
            let close = tree.rfind('}').filter(|c| *c > open).unwrap_or(tree.len());
            let inner = &tree[open + 1..close];
            let depth = prefix.len();
            prefix.extend(head);
            out.push(prefix.clone());
            // Split the inner list at top-level commas.
            let mut level = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => level += 1,
                    '}' => level -= 1,
                    ',' if level == 0 => {
                        expand(&inner[start..i], prefix, out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            expand(&inner[start..], prefix, out);
            prefix.truncate(depth);
        }
    }
}

/// The module a path from `from` names: the longest prefix that is a module.
fn resolve(from: &str, path: &[String], modules: &BTreeMap<Module, String>) -> Option<Module> {
    let mut base: Vec<&str> = from.split("::").filter(|s| !s.is_empty()).collect();
    let mut rest = path;
    match rest.first()?.as_str() {
        "crate" => {
            base.clear();
            rest = &rest[1..];
        }
        "self" => rest = &rest[1..],
        _ => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
    }
    (0..=rest.len()).rev().find_map(|n| {
        let mut m = base.clone();
        m.extend(rest[..n].iter().map(String::as_str));
        let name = m.join("::");
        modules.contains_key(&name).then_some(name)
    })
}

fn uses() -> BTreeMap<Module, BTreeSet<Module>> {
    let modules = modules();
    modules
        .iter()
        .map(|(m, code)| {
            let used = paths(code)
                .iter()
                .filter_map(|p| resolve(m, p, &modules))
                .filter(|u| u != m && !u.is_empty())
                // A module's children are its own; a child using its parent is fine.
                .filter(|u| !m.starts_with(&format!("{u}::")))
                .collect();
            (m.clone(), used)
        })
        .collect()
}

fn layer(m: &str) -> &str {
    m.split("::").next().unwrap_or_default()
}

#[test]
fn the_arrows_run_one_way() {
    let mut wrong = Vec::new();
    for (m, used) in uses() {
        for u in used {
            let forbidden = match layer(&m) {
                "config" | "store" => matches!(layer(&u), "engine" | "service" | "server"),
                "engine" => matches!(layer(&u), "service" | "server"),
                "service" => layer(&u) == "server",
                // Tools every layer uses: they use none of them.
                "support" => layer(&u) != "support",
                _ => false,
            };
            if forbidden {
                wrong.push(format!("{m} uses {u}"));
            }
        }
    }
    assert!(wrong.is_empty(), "arrows running back: {wrong:#?}");
}

#[test]
fn no_two_files_use_each_other() {
    let uses = uses();
    // A loop exists if a module reaches itself.
    let mut loops = Vec::new();
    for start in uses.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<(Module, Vec<Module>)> = vec![(start.clone(), vec![start.clone()])];
        while let Some((m, trail)) = stack.pop() {
            for u in uses.get(&m).into_iter().flatten() {
                if u == start {
                    loops.push(format!("{} -> {start}", trail.join(" -> ")));
                } else if seen.insert(u.clone()) {
                    let mut t = trail.clone();
                    t.push(u.clone());
                    stack.push((u.clone(), t));
                }
            }
        }
    }
    assert!(loops.is_empty(), "files using each other: {loops:#?}");
}

#[test]
fn the_checker_sees_uses() {
    // Guards the parser: known arrows must be found, or the tests above prove nothing.
    let uses = uses();
    assert!(
        uses["engine::acquire::decide"].contains("store"),
        "{:?}",
        uses["engine::acquire::decide"]
    );
    assert!(uses["server::rls"].contains("service::decision"));
    assert!(uses["service::decision::steps"].contains("service::descriptor_status"));
    assert!(uses["store::memory::partition"].contains("store::memory::slot"));
    assert!(
        uses["<main>"].is_empty(),
        "main uses the library by its name"
    );
}

#[test]
fn only_the_transport_and_the_stores_open_sockets() {
    // The policy, the engine and the config own no socket: calls come in and answers go
    // out through `server/`; a store's connections are its own.
    let sockets = [
        "tokio::net",
        "std::net::Tcp",
        "std::net::Udp",
        "TcpStream",
        "UdpSocket",
    ];
    let mut wrong = Vec::new();
    for (m, code) in modules() {
        if matches!(layer(&m), "service" | "engine" | "config" | "support") {
            for s in sockets.iter().filter(|s| code.contains(**s)) {
                wrong.push(format!("{m} mentions {s}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "sockets outside the transport: {wrong:#?}"
    );
    // The check sees what it looks for.
    assert!(modules()["server::statsd"].contains("UdpSocket"));
}

/// The identifiers a source mentions.
fn words(code: &str) -> BTreeSet<&str> {
    code.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect()
}

/// The types a source defines at its top level (`struct`, `enum`, `type`, `trait`).
fn top_level_types(code: &str) -> Vec<&str> {
    code.lines()
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| {
            let rest = match l.strip_prefix("pub") {
                Some(r) if r.starts_with('(') => r.split_once(')')?.1.trim_start(),
                Some(r) => r.trim_start(),
                None => l,
            };
            let (kind, rest) = rest.split_once(' ')?;
            matches!(kind, "struct" | "enum" | "type" | "trait").then(|| {
                rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .next()
                    .unwrap_or_default()
            })
        })
        .filter(|name| !name.is_empty())
        .collect()
}

#[test]
fn a_parent_module_defines_no_type_its_children_use() {
    // A module with children is their table of contents: what they share lives in a
    // file named for it, which they import, never in the parent they hang from.
    let modules = modules();
    // Guards the reading: a type a sibling uses must be seen as defined and as used.
    assert!(top_level_types(&modules["engine::acquire::state"]).contains(&"Deciding"));
    assert!(words(&modules["engine::acquire::decide"]).contains("Deciding"));
    let mut wrong = Vec::new();
    for (parent, code) in &modules {
        if parent.is_empty() || parent == "<main>" {
            continue;
        }
        let prefix = format!("{parent}::");
        let children: Vec<(&Module, &String)> = modules
            .iter()
            .filter(|(m, _)| m.starts_with(&prefix) && !m.ends_with("tests"))
            .collect();
        for ty in top_level_types(code) {
            for (child, child_code) in &children {
                if words(child_code).contains(ty) {
                    wrong.push(format!("{parent} defines {ty}, which {child} uses"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "types to move into files of their own: {wrong:#?}"
    );
}

/// Longest a function of `src/` may be outside tests, in lines, signature to brace.
const MAX_FUNCTION_LINES: usize = 80;

/// Each function of `code` (one file's non-test code) longer than
/// [`MAX_FUNCTION_LINES`]: its first line (1-based) and length, signature to brace; and
/// how many functions were measured and the longest.
fn long_functions(code: &str) -> (Vec<(usize, usize)>, usize, usize) {
    let (mut long, mut functions, mut longest) = (Vec::new(), 0, 0);
    let lines: Vec<&str> = code.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let signature = ["", "pub ", "pub(crate) ", "pub(super) "]
            .iter()
            .flat_map(|vis| ["fn ", "async fn ", "const fn "].map(|f| format!("{vis}{f}")))
            .any(|start| trimmed.starts_with(&start));
        if !signature {
            continue;
        }
        // The body opens on the first line ending in `{`; a declaration ends in `;`.
        let Some(open) = (i..lines.len()).find(|&j| {
            let t = lines[j].trim_end();
            t.ends_with('{') || t.ends_with(';')
        }) else {
            continue;
        };
        if lines[open].trim_end().ends_with(';') {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        if let Some(end) = (open..lines.len()).find(|&j| lines[j].trim_end() == close) {
            let n = end - i + 1;
            functions += 1;
            longest = longest.max(n);
            if n > MAX_FUNCTION_LINES {
                long.push((i + 1, n));
            }
        }
    }
    (long, functions, longest)
}

#[test]
fn no_function_is_longer_than_a_screen() {
    let mut long = Vec::new();
    let (mut functions, mut longest) = (0, 0);
    for (module, code) in modules() {
        if module.ends_with("tests") {
            continue;
        }
        let (found, n, l) = long_functions(&code);
        functions += n;
        longest = longest.max(l);
        long.extend(
            found
                .into_iter()
                .map(|(line, n)| format!("{module}: line {line} ({n} lines)")),
        );
    }
    // Guards the reading: every file's functions are found and measured.
    assert!(
        functions > 1_000 && longest > 40,
        "{functions} functions, longest {longest}"
    );
    assert!(long.is_empty(), "functions to split: {long:#?}");
}

/// What the reading once missed: each file was cut at its first `#[cfg(test)]`, so a
/// function after a test-only `use` (or a test helper) was never measured.
#[test]
fn a_long_function_after_a_test_only_use_is_found() {
    let body = "    let _ = 1;\n".repeat(MAX_FUNCTION_LINES - 1);
    let source = format!(
        "use std::fmt;\n\n#[cfg(test)]\nuse std::collections::BTreeMap;\n\n#[cfg(test)]\nfn helper() {{}}\n\npub fn long() {{\n{body}}}\n\n#[cfg(test)]\nmod tests {{\n    fn in_tests() {{\n{body}{body}    }}\n}}\n"
    );
    let code = without_test_items(&source);
    let line_of = |text: &str| text.lines().position(|l| l.starts_with("pub fn long"));
    assert_eq!(line_of(&code), line_of(&source), "lines kept in place");
    assert!(!code.contains("BTreeMap") && !code.contains("helper") && !code.contains("in_tests"));
    let (long, functions, _) = long_functions(&code);
    assert_eq!(functions, 1, "{code}");
    assert_eq!(long, vec![(9, MAX_FUNCTION_LINES + 1)]);
}

/// Longest a file of `src/` may be, its unit tests included.
const MAX_FILE_LINES: usize = 600;

#[test]
fn no_file_is_longer_than_its_limit() {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let n = std::fs::read_to_string(&path).unwrap().lines().count();
                let name = path.display().to_string();
                if n > MAX_FILE_LINES {
                    out.push(format!("{name}: {n} lines"));
                }
            }
        }
    }
    let mut long = Vec::new();
    walk(Path::new("src"), &mut long);
    assert!(
        long.is_empty(),
        "files to split (at most {MAX_FILE_LINES} lines): {long:#?}"
    );
}
