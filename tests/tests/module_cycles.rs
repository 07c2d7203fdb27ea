//! Layers import downward: within every crate of the workspace, no top-level module reaches
//! itself again through `crate::` paths (ARCHITECTURE.md's layer maps).
//!
//! `no_crate_has_a_module_cycle` reads the `src/` of every `[workspace] members` entry of the
//! root Cargo.toml and, for each crate target (`lib.rs`, `main.rs`, `bin/*.rs`, with the files
//! their `mod` declarations reach), builds the graph between its top-level modules: a module
//! is the first segment after `crate::` (`src/zone/journal.rs` belongs to `zone`), a
//! `super::` counts as an edge only when it climbs to the crate root, and a name the root
//! re-exports (`pub use zone::Serial;`, or a `#[macro_export]` macro) counts as the module it
//! comes from. The root itself is a node (`crate`) when `lib.rs` has code of its own: its bare
//! `module::` paths are its edges, and so is a `use` in it whose name its own code uses (a
//! glob always counts); any other `use` there only re-exports. Any strongly connected
//! component of more than one node fails the test, which names every module in it, one
//! shortest cycle, and the file, line and path of each edge inside it.
//!
//! What it does not count: comments (doc comments included) and string literals, except the
//! path strings of attributes (`#[serde(with = "crate::codec")]`), which are real uses; code
//! under `#[cfg(test)]` or `#[test]` (a test module, a test-only item, a file declared by
//! `#[cfg(test)] mod tests;`), since a test may reach across the layers it checks; and bare
//! macro calls (`out!`) resolved by textual scope. A path built by a macro from fragments is
//! invisible to it.
//!
//! The checker's core is a pure function over `(path, text)` pairs with no dependency beyond
//! std, so that `the_checker_finds_a_two_module_cycle` proves on two strings that it catches
//! a cycle (teeth), and `the_checker_is_not_fooled` that comments, strings, test modules and
//! `super::` within a module are not taken for edges.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};

/// A failure printed as it is: the test harness shows an `Err` with `Debug`, which would
/// escape every newline of the list of cycles.
pub struct Failure(pub String);

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[test]
fn no_crate_has_a_module_cycle() -> Result<(), Failure> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    check_workspace(&root).map_err(Failure)
}

#[test]
fn the_checker_finds_a_two_module_cycle() -> Result<(), Failure> {
    let files = [
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "use crate::b::B;\npub struct A(B);\n"),
        ("b.rs", "pub struct B;\npub trait Make {\n    fn make(&self) -> crate::a::A;\n}\n"),
    ];
    let files: Vec<(String, String)> = files.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect();
    let Err(report) = check_crate("synthetic", &files) else {
        return Err(Failure("the cycle a -> b -> a was not found".into()));
    };
    for expected in ["a, b", "synthetic/src/a.rs:1 a -> b: crate::b::B", "synthetic/src/b.rs:3 b -> a: crate::a::A"] {
        if !report.contains(expected) {
            return Err(Failure(format!("the report lacks {expected:?}:\n{report}")));
        }
    }
    Ok(())
}

#[test]
fn the_checker_is_not_fooled() -> Result<(), Failure> {
    let files = [
        ("lib.rs", "//! `b` uses crate::a::A\nmod a;\nmod b;\n"),
        ("a.rs", "mod inner;\nuse crate::b::B;\npub struct A(B);\n"),
        // `super::` from a's submodule stays within `a`.
        ("a/inner.rs", "use super::A;\n"),
        (
            "b.rs",
            concat!(
                "// crate::a::A in a comment\n",
                "/// crate::a::A in a doc comment\n",
                "/* crate::a::A /* nested */ crate::a::A */\n",
                "pub struct B;\n",
                "const S: &str = \"crate::a::A\";\n",
                "const R: &str = r#\"crate::a::A\"#;\n",
                "const C: char = '\"';\n",
                "fn f<'a>(x: &'a str) -> &'a str { x }\n",
                "#[cfg(test)]\n",
                "use crate::a::A;\n",
                "#[cfg(test)]\n",
                "mod tests {\n",
                "    use crate::a::A;\n",
                "}\n",
                "#[cfg(test)]\n",
                "mod more;\n",
            ),
        ),
        ("b/more.rs", "use crate::a::A;\n"),
    ];
    let files: Vec<(String, String)> = files.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect();
    check_crate("synthetic", &files).map_err(|report| Failure(format!("a cycle was found where there is none:\n{report}")))?;
    // The same crate, with one real use added after all of them: now it is a cycle.
    let mut cyclic = files.clone();
    if let Some((_, text)) = cyclic.iter_mut().find(|(p, _)| p == "b.rs") {
        text.push_str("pub fn g(_: &crate::a::A) {}\n");
    }
    match check_crate("synthetic", &cyclic) {
        Err(report) if report.contains("synthetic/src/b.rs:17 b -> a: crate::a::A") => Ok(()),
        other => Err(Failure(format!("the use on line 17 was not the one edge b -> a: {other:?}"))),
    }
}

// The workspace: which crates, which files.

/// Checks every member crate of the workspace at `root`; the error lists the cycles of all.
pub fn check_workspace(root: &Path) -> Result<(), String> {
    let mut failures = Vec::new();
    for member in workspace_members(root)? {
        let files = source_files(&root.join(&member).join("src"))?;
        if let Err(report) = check_crate(&member, &files) {
            failures.push(report);
        }
    }
    if failures.is_empty() { Ok(()) } else { Err(failures.join("\n")) }
}

/// The `members` of the root Cargo.toml's `[workspace]`, a trailing `/*` expanded to the
/// directories under it that hold a Cargo.toml.
pub fn workspace_members(root: &Path) -> Result<Vec<String>, String> {
    let manifest = root.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let mut in_workspace = false;
    let mut list: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(open) = list.as_mut() {
            open.push_str(trimmed);
            if trimmed.contains(']') {
                break;
            }
            continue;
        }
        if trimmed.starts_with('[') {
            in_workspace = trimmed == "[workspace]";
        } else if in_workspace && trimmed.starts_with("members") {
            let value = trimmed.split_once('=').map(|(_, v)| v.trim()).unwrap_or_default();
            list = Some(value.to_string());
            if value.contains(']') {
                break;
            }
        }
    }
    let list = list.ok_or_else(|| format!("{}: no [workspace] members", manifest.display()))?;
    let list = list.split('#').next().unwrap_or_default();
    let mut members = Vec::new();
    for quoted in list.split('"').skip(1).step_by(2) {
        match quoted.strip_suffix("/*") {
            Some(dir) => {
                let entries = std::fs::read_dir(root.join(dir)).map_err(|e| format!("{dir}: {e}"))?;
                let mut found: Vec<String> = entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.path().join("Cargo.toml").is_file())
                    .map(|e| format!("{dir}/{}", e.file_name().to_string_lossy()))
                    .collect();
                found.sort();
                members.extend(found);
            }
            None => members.push(quoted.to_string()),
        }
    }
    if members.is_empty() {
        return Err(format!("{}: [workspace] members is empty", manifest.display()));
    }
    Ok(members)
}

/// Every `.rs` file under `src`, as (path relative to `src` with `/`, text), sorted by path.
pub fn source_files(src: &Path) -> Result<Vec<(String, String)>, String> {
    let mut files = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let dir = src.join(&rel);
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = rel.join(&name);
            if entry.path().is_dir() {
                dirs.push(path);
            } else if name.ends_with(".rs") {
                let text = std::fs::read_to_string(entry.path()).map_err(|e| format!("{}: {e}", entry.path().display()))?;
                let parts: Vec<String> = path.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
                files.push((parts.join("/"), text));
            }
        }
    }
    files.sort();
    Ok(files)
}

// The core: pure, over (path relative to `src/`, text) pairs.

/// The name of the crate root as a node of the graph.
pub const ROOT: &str = "crate";

/// One place where a top-level module names another.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    pub from: String,
    pub to: String,
    /// Relative to `src/`.
    pub file: String,
    /// 1-based.
    pub line: usize,
    /// The paths named there, as written (a use group gives several).
    pub paths: Vec<String>,
    /// Under `#[cfg(test)]` or `#[test]`: listed, never a failure.
    pub test: bool,
}

/// One crate target: its root file, its top-level modules and the edges between them.
#[derive(Debug)]
pub struct Target {
    pub root: String,
    pub modules: BTreeSet<String>,
    pub edges: Vec<Edge>,
}

/// Passes when no target of the crate has a cycle; else the report, one line per edge.
pub fn check_crate(label: &str, files: &[(String, String)]) -> Result<(), String> {
    let mut report = String::new();
    for target in crate_targets(files) {
        let build: Vec<Edge> = target.edges.iter().filter(|e| !e.test).cloned().collect();
        for component in cycles(&build) {
            report.push_str(&format!("{label}/src/{}: modules in a cycle: {}\n", target.root, component.join(", ")));
            if let Some(cycle) = shortest_cycle(&build, &component) {
                report.push_str(&format!("  e.g. {}\n", cycle.join(" -> ")));
            }
            let mut inside: Vec<&Edge> = build.iter().filter(|e| component.contains(&e.from) && component.contains(&e.to)).collect();
            inside.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
            for e in inside {
                report.push_str(&format!("  {label}/src/{}:{} {} -> {}: {}\n", e.file, e.line, e.from, e.to, e.paths.join(", ")));
            }
        }
    }
    if report.is_empty() { Ok(()) } else { Err(report) }
}

/// The strongly connected components of more than one node, each sorted, in sorted order.
pub fn cycles(edges: &[Edge]) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for e in edges {
        if e.from != e.to {
            next.entry(&e.from).or_default().insert(&e.to);
            next.entry(&e.to).or_default();
        }
    }
    // Kosaraju: the order in which nodes finish, then the transposed graph in reverse order.
    let mut finished: Vec<&str> = Vec::new();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for &start in next.keys() {
        if !seen.insert(start) {
            continue;
        }
        let mut stack: Vec<(&str, Vec<&str>)> = vec![(start, next[start].iter().copied().collect())];
        while let Some((node, pending)) = stack.last_mut() {
            match pending.pop() {
                Some(n) if seen.insert(n) => {
                    let after: Vec<&str> = next[n].iter().copied().collect();
                    stack.push((n, after));
                }
                Some(_) => {}
                None => {
                    finished.push(node);
                    stack.pop();
                }
            }
        }
    }
    let mut back: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (&from, tos) in &next {
        for &to in tos {
            back.entry(to).or_default().push(from);
        }
    }
    let mut assigned: BTreeSet<&str> = BTreeSet::new();
    let mut components = Vec::new();
    for &start in finished.iter().rev() {
        if !assigned.insert(start) {
            continue;
        }
        let mut component = vec![start.to_string()];
        let mut todo = vec![start];
        while let Some(node) = todo.pop() {
            for &n in back.get(node).map(Vec::as_slice).unwrap_or_default() {
                if assigned.insert(n) {
                    component.push(n.to_string());
                    todo.push(n);
                }
            }
        }
        if component.len() > 1 {
            component.sort();
            components.push(component);
        }
    }
    components.sort();
    components
}

/// A shortest cycle through the component's first module, staying in the component.
pub fn shortest_cycle(edges: &[Edge], component: &[String]) -> Option<Vec<String>> {
    let start = component.first()?;
    let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue: VecDeque<&str> = VecDeque::from([start.as_str()]);
    while let Some(node) = queue.pop_front() {
        for e in edges.iter().filter(|e| e.from == node && e.from != e.to && component.contains(&e.to)) {
            if e.to == *start {
                let mut back = Vec::new();
                let mut at = node;
                while at != start {
                    back.push(at.to_string());
                    at = parent.get(at)?;
                }
                back.push(start.clone());
                back.reverse();
                back.push(start.clone());
                return Some(back);
            }
            if !parent.contains_key(e.to.as_str()) && e.to != *start {
                parent.insert(&e.to, node);
                queue.push_back(&e.to);
            }
        }
    }
    None
}

/// The targets of a crate's `src/`: one per root file, with the modules its `mod`s reach.
pub fn crate_targets(files: &[(String, String)]) -> Vec<Target> {
    let texts: BTreeMap<&str, &str> = files.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
    let roots = texts.keys().filter(|p| {
        **p == "lib.rs" || **p == "main.rs" || p.strip_prefix("bin/").is_some_and(|b| !b.contains('/') || b.ends_with("/main.rs"))
    });
    roots.map(|root| target(root, &texts)).collect()
}

/// A file of a target: where it sits in the module tree.
struct Placed {
    path: String,
    /// The top-level module it belongs to; `None` for the root file.
    module: Option<String>,
    /// How many modules deep the file's own module is (root 0, `src/a.rs` 1).
    depth: usize,
    /// Reached only through a `#[cfg(test)] mod`.
    test: bool,
}

fn target(root: &str, texts: &BTreeMap<&str, &str>) -> Target {
    let mut queue = VecDeque::from([Placed { path: root.to_string(), module: None, depth: 0, test: false }]);
    let mut modules = BTreeSet::new();
    let mut scans: Vec<(Placed, Scan)> = Vec::new();
    let mut visited = BTreeSet::new();
    while let Some(placed) = queue.pop_front() {
        let Some(text) = texts.get(placed.path.as_str()) else { continue };
        if !visited.insert(placed.path.clone()) {
            continue;
        }
        let scan = scan(text, placed.depth, placed.module.is_none());
        let dir = module_dir(&placed.path, placed.depth == 0);
        for decl in &scan.mods {
            let mut base = dir.clone();
            for m in &decl.inline {
                base.push_str(m);
                base.push('/');
            }
            let candidates = match &decl.path_attr {
                Some(p) => vec![format!("{}{p}", parent_dir(&placed.path))],
                None => vec![format!("{base}{}.rs", decl.name), format!("{base}{}/mod.rs", decl.name)],
            };
            let module = placed.module.clone().or_else(|| decl.inline.first().cloned()).unwrap_or_else(|| decl.name.clone());
            if placed.depth == 0 && decl.inline.is_empty() {
                modules.insert(decl.name.clone());
            }
            if let Some(path) = candidates.into_iter().find(|c| texts.contains_key(c.as_str())) {
                let depth = placed.depth + decl.inline.len() + 1;
                queue.push_back(Placed { path, module: Some(module), depth, test: placed.test || decl.test });
            }
        }
        if placed.depth == 0 {
            modules.extend(scan.inline_top.iter().cloned());
        }
        scans.push((placed, scan));
    }
    // The root's names that stand for a module: its `use`s and the crates' exported macros.
    let mut aliases: BTreeMap<String, String> = BTreeMap::new();
    for (placed, scan) in &scans {
        if placed.depth == 0 {
            for r in scan.refs.iter().filter(|r| r.in_use && r.context.is_none()) {
                if let (Some(first), Some(alias)) = (r.segments.first(), &r.alias)
                    && modules.contains(first)
                    && alias != first
                    && alias != "self"
                    && alias != "*"
                {
                    aliases.insert(alias.clone(), first.clone());
                }
            }
        }
        if let Some(module) = &placed.module {
            for name in &scan.exported_macros {
                aliases.insert(name.clone(), module.clone());
            }
        }
    }
    let mut grouped: BTreeMap<(String, String, String, usize, bool), Vec<String>> = BTreeMap::new();
    for (placed, scan) in &scans {
        for r in &scan.refs {
            let from = placed.module.clone().or_else(|| r.context.clone());
            let Some(first) = r.segments.first() else { continue };
            let to = if modules.contains(first) {
                first.clone()
            } else if let Some(m) = aliases.get(first) {
                m.clone()
            } else if r.bare {
                continue;
            } else {
                ROOT.to_string()
            };
            let from = match from {
                Some(m) => m,
                // A `use` of the root is its own dependency only if its code names what it
                // binds (a glob always counts); else it only re-exports.
                None if r.in_use && r.alias.as_ref().is_some_and(|a| a != "*" && !scan.root_idents.contains(a)) => continue,
                None => ROOT.to_string(),
            };
            if from == to {
                continue;
            }
            let key = (from, to, placed.path.clone(), r.line, placed.test || r.test);
            grouped.entry(key).or_default().push(format!("{}{}", r.written, r.segments.join("::")));
        }
    }
    let edges = grouped.into_iter().map(|((from, to, file, line, test), paths)| Edge { from, to, file, line, paths, test }).collect();
    Target { root: root.to_string(), modules, edges }
}

/// Where the files of a file's child modules live: `a/` for `a.rs`, `a/` for `a/mod.rs`.
fn module_dir(path: &str, is_root: bool) -> String {
    let mod_rs = is_root || path == "mod.rs" || path.ends_with("/mod.rs");
    if mod_rs { parent_dir(path) } else { format!("{}/", path.trim_end_matches(".rs")) }
}

fn parent_dir(path: &str) -> String {
    path.rfind('/').map(|i| path[..=i].to_string()).unwrap_or_default()
}

// Lexing: comments and literals out, tokens with their lines.

#[derive(Clone, Debug, PartialEq)]
enum Tk {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
    Str(String),
}

#[derive(Clone, Debug)]
struct Tok {
    tk: Tk,
    line: usize,
}

fn lex(text: &str) -> Vec<Tok> {
    let c: Vec<char> = text.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if ch == '"' {
            let start_line = line;
            let mut s = String::new();
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    s.push(c[i]);
                    i += 1;
                }
                if i < c.len() {
                    line += usize::from(c[i] == '\n');
                    s.push(c[i]);
                    i += 1;
                }
            }
            i += 1;
            out.push(Tok { tk: Tk::Str(s), line: start_line });
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime or label ('a).
            if at(i + 1) == '\\' {
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok { tk: Tk::Punct('0'), line });
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let raw_prefix = matches!(word.as_str(), "r" | "br" | "cr");
            if word == "r" && at(i) == '#' && (at(i + 1).is_alphabetic() || at(i + 1) == '_') {
                // A raw identifier: r#type.
                let start = i + 1;
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
                out.push(Tok { tk: Tk::Ident(c[start..i].iter().collect()), line });
            } else if raw_prefix && (at(i) == '"' || at(i) == '#') {
                let start_line = line;
                let mut hashes = 0;
                while at(i) == '#' {
                    hashes += 1;
                    i += 1;
                }
                i += 1;
                let mut s = String::new();
                while i < c.len() {
                    if c[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                        i += 1 + hashes;
                        break;
                    }
                    line += usize::from(c[i] == '\n');
                    s.push(c[i]);
                    i += 1;
                }
                out.push(Tok { tk: Tk::Str(s), line: start_line });
            } else if (word == "b" || word == "c") && at(i) == '"' {
                // The string itself comes next round.
            } else if word == "b" && at(i) == '\'' {
                i += if at(i + 1) == '\\' { 3 } else { 2 };
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else {
                out.push(Tok { tk: Tk::Ident(word), line });
            }
        } else if ch == ':' && at(i + 1) == ':' {
            out.push(Tok { tk: Tk::Sep, line });
            i += 2;
        } else {
            out.push(Tok { tk: Tk::Punct(ch), line });
            i += 1;
        }
    }
    out
}

// Scanning one file: its `mod`s and the paths it names from the crate root.

/// A `mod name;` of a file.
struct ModDecl {
    name: String,
    /// The inline modules it sits in, outermost first.
    inline: Vec<String>,
    path_attr: Option<String>,
    test: bool,
}

/// A path that leaves the file's top-level module, as segments from the crate root.
#[derive(Debug)]
struct Ref {
    segments: Vec<String>,
    /// What stood before them: `crate::`, `super::super::`, or nothing in the root.
    written: String,
    line: usize,
    test: bool,
    in_use: bool,
    /// The name a `use` binds (the last segment or its `as`).
    alias: Option<String>,
    /// Written without `crate::` in the root (`use a::X;`): a module's only if `a` is one.
    bare: bool,
    /// In the root file, the outermost inline module it sits in.
    context: Option<String>,
}

#[derive(Default)]
struct Scan {
    mods: Vec<ModDecl>,
    /// The root file's `mod name { .. }`.
    inline_top: Vec<String>,
    refs: Vec<Ref>,
    exported_macros: Vec<String>,
    /// Every name the root file's own code (outside `use`s and inline modules) starts a path
    /// or a type with: which of its `use`s it needs itself.
    root_idents: BTreeSet<String>,
}

struct Scope {
    test: bool,
    inline_mod: Option<String>,
}

/// Which test-only item is open: it ends at a `;` at its depth, or (unless `semicolon_only`)
/// when the brace block it opened at its depth closes.
struct TestItem {
    depth: usize,
    semicolon_only: bool,
}

fn scan(text: &str, file_depth: usize, is_root: bool) -> Scan {
    let toks = lex(text);
    let tk = |i: usize| toks.get(i).map(|t| &t.tk);
    let ident = |i: usize| match tk(i) {
        Some(Tk::Ident(s)) => Some(s.as_str()),
        _ => None,
    };
    let mut out = Scan::default();
    let mut stack: Vec<Scope> = Vec::new();
    let mut test_item: Option<TestItem> = None;
    let mut file_test = false;
    let mut pending_test = false;
    let mut pending_path: Option<String> = None;
    let mut pending_export = false;
    // Inside a `use` statement.
    let mut in_use = false;
    let mut i = 0;
    while i < toks.len() {
        let in_test = file_test || test_item.is_some() || stack.iter().any(|s| s.test);
        let inline: Vec<String> = stack.iter().filter_map(|s| s.inline_mod.clone()).collect();
        let depth = file_depth + inline.len();
        let context = if is_root { inline.first().cloned() } else { None };
        match &toks[i].tk {
            Tk::Punct('#') => {
                let inner = tk(i + 1) == Some(&Tk::Punct('!'));
                let open = if inner { i + 2 } else { i + 1 };
                if tk(open) != Some(&Tk::Punct('[')) {
                    i += 1;
                    continue;
                }
                let mut close = open;
                let mut level = 0;
                while close < toks.len() {
                    match tk(close) {
                        Some(Tk::Punct('[')) => level += 1,
                        Some(Tk::Punct(']')) => {
                            level -= 1;
                            if level == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    close += 1;
                }
                let attr = &toks[open + 1..close.min(toks.len())];
                let idents: Vec<&str> = attr
                    .iter()
                    .filter_map(|t| match &t.tk {
                        Tk::Ident(s) => Some(s.as_str()),
                        _ => None,
                    })
                    .collect();
                // The attribute's path (`test`, `tokio::test`, `cfg`) and what follows it.
                let path_len = attr.iter().take_while(|t| matches!(t.tk, Tk::Ident(_) | Tk::Sep)).count();
                let head: Vec<&str> = idents.iter().copied().take(path_len.div_ceil(2)).collect();
                let bare_or_call = attr.get(path_len).is_none_or(|t| t.tk == Tk::Punct('('));
                let test_attr = head.last() == Some(&"test") && bare_or_call;
                let test_cfg = head == ["cfg"] && idents.contains(&"test") && !idents.contains(&"not");
                if test_attr || test_cfg {
                    if inner && stack.is_empty() {
                        file_test = true;
                    } else if !inner {
                        pending_test = true;
                    }
                }
                if head == ["macro_export"] {
                    pending_export = true;
                }
                if head == ["path"]
                    && let Some(Tk::Str(p)) = attr.get(2).map(|t| &t.tk)
                {
                    pending_path = Some(p.clone());
                }
                // Path strings of attributes, as serde's `with = "crate::codec"`, are real uses.
                for t in attr {
                    let Tk::Str(s) = &t.tk else { continue };
                    let segments: Vec<&str> = s.split("::").collect();
                    let is_path =
                        segments.len() > 1 && segments.iter().all(|s| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_'));
                    if !is_path {
                        continue;
                    }
                    let climbs = segments.iter().take_while(|s| **s == "super").count();
                    let skip = climbs.max(1);
                    if !at_root(segments[0], climbs, depth, is_root && inline.is_empty()) {
                        continue;
                    }
                    out.refs.push(Ref {
                        written: segments[..skip].iter().map(|s| format!("{s}::")).collect(),
                        segments: segments[skip..].iter().map(|s| s.to_string()).collect(),
                        line: t.line,
                        test: in_test || pending_test,
                        in_use: false,
                        alias: None,
                        bare: false,
                        context: context.clone(),
                    });
                }
                i = close + 1;
                continue;
            }
            Tk::Punct('{') => {
                let inline_mod = match (i.checked_sub(2).and_then(ident), i.checked_sub(1).and_then(ident)) {
                    (Some("mod"), Some(name)) => Some(name.to_string()),
                    _ => None,
                };
                if is_root
                    && stack.is_empty()
                    && let Some(name) = &inline_mod
                {
                    out.inline_top.push(name.clone());
                }
                stack.push(Scope { test: in_test, inline_mod });
            }
            Tk::Punct('}') => {
                stack.pop();
                if test_item.as_ref().is_some_and(|t| !t.semicolon_only && t.depth == stack.len()) {
                    test_item = None;
                }
            }
            Tk::Punct(';') => {
                in_use = false;
                if test_item.as_ref().is_some_and(|t| t.depth == stack.len()) {
                    test_item = None;
                }
            }
            Tk::Ident(word) => {
                if pending_test && !in_test {
                    let mut k = i;
                    while let Some(w) = ident(k)
                        && matches!(w, "pub" | "unsafe" | "async" | "extern" | "default")
                    {
                        k += 1;
                        if w == "pub" && tk(k) == Some(&Tk::Punct('(')) {
                            while tk(k).is_some() && tk(k) != Some(&Tk::Punct(')')) {
                                k += 1;
                            }
                            k += 1;
                        }
                    }
                    let semicolon_only = matches!(ident(k), Some("use" | "const" | "static" | "type" | "let"));
                    test_item = Some(TestItem { depth: stack.len(), semicolon_only });
                }
                let test = in_test || pending_test;
                pending_test = false;
                if is_root && inline.is_empty() && !in_use {
                    out.root_idents.insert(word.clone());
                }
                let word = word.as_str();
                let prev = i.checked_sub(1).and_then(&tk);
                let at_path_start = !matches!(prev, Some(Tk::Sep) | Some(Tk::Punct('.')));
                if word == "mod"
                    && let Some(name) = ident(i + 1)
                    && tk(i + 2) == Some(&Tk::Punct(';'))
                {
                    out.mods.push(ModDecl { name: name.to_string(), inline: inline.clone(), path_attr: pending_path.take(), test });
                    pending_export = false;
                    i += 3;
                    // The `;` ends a test-only `mod tests;` too.
                    if test_item.as_ref().is_some_and(|t| t.depth == stack.len()) {
                        test_item = None;
                    }
                    continue;
                }
                if word == "macro_rules"
                    && tk(i + 1) == Some(&Tk::Punct('!'))
                    && let Some(name) = ident(i + 2)
                {
                    if pending_export {
                        out.exported_macros.push(name.to_string());
                    }
                    pending_export = false;
                }
                if word == "use" && at_path_start {
                    in_use = true;
                }
                let root_code = is_root && inline.is_empty();
                // Where a path starts: (whether it goes on from the crate root, where its tree
                // starts, how it was written).
                let path_start = tk(i + 1) == Some(&Tk::Sep) && at_path_start;
                let start = match word {
                    "crate" | "self" if path_start => Some((at_root(word, 0, depth, root_code), i + 2, format!("{word}::"))),
                    "super" if path_start => {
                        let mut k = i;
                        let mut climbs = 0;
                        while ident(k) == Some("super") && tk(k + 1) == Some(&Tk::Sep) {
                            climbs += 1;
                            k += 2;
                        }
                        Some((at_root(word, climbs, depth, root_code), k, "super::".repeat(climbs)))
                    }
                    _ if root_code && path_start => Some((true, i, String::new())),
                    _ => None,
                };
                if let Some((root, at, written)) = start {
                    let mut leaves = Vec::new();
                    let end = use_tree(&toks, at, &[], &mut leaves);
                    for (segments, line, alias) in leaves.into_iter().filter(|(segments, _, _)| root && !segments.is_empty()) {
                        let bare = written.is_empty();
                        out.refs.push(Ref {
                            segments,
                            written: written.clone(),
                            line,
                            test,
                            in_use,
                            alias,
                            bare,
                            context: context.clone(),
                        });
                    }
                    i = end.max(i + 1);
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Whether a path that starts with `lead` (climbing `climbs` times for `super`) goes on from
/// the crate root, rather than within the file's own top-level module.
fn at_root(lead: &str, climbs: usize, depth: usize, root_code: bool) -> bool {
    match lead {
        "crate" => true,
        "self" => root_code,
        "super" => climbs == depth,
        _ => false,
    }
}

/// Reads a path or use tree from `at`: its leaves as (segments, line of the first, bound
/// name), and the index after it.
fn use_tree(toks: &[Tok], at: usize, prefix: &[(String, usize)], leaves: &mut Vec<(Vec<String>, usize, Option<String>)>) -> usize {
    let leaf = |path: &[(String, usize)], alias: Option<String>| {
        let line = path.first().map(|s| s.1).unwrap_or_else(|| toks.get(at).map(|t| t.line).unwrap_or(0));
        (path.iter().map(|s| s.0.clone()).collect::<Vec<_>>(), line, alias)
    };
    let mut path = prefix.to_vec();
    let mut i = at;
    loop {
        match toks.get(i).map(|t| &t.tk) {
            Some(Tk::Punct('{')) => {
                i += 1;
                loop {
                    match toks.get(i).map(|t| &t.tk) {
                        None => return i,
                        Some(Tk::Punct('}')) => return i + 1,
                        Some(Tk::Punct(',')) => i += 1,
                        Some(_) => {
                            let next = use_tree(toks, i, &path, leaves);
                            i = if next > i { next } else { i + 1 };
                        }
                    }
                }
            }
            Some(Tk::Punct('*')) => {
                path.push(("*".to_string(), toks[i].line));
                leaves.push(leaf(&path, Some("*".to_string())));
                return i + 1;
            }
            Some(Tk::Ident(s)) => {
                path.push((s.clone(), toks[i].line));
                i += 1;
                if toks.get(i).map(|t| &t.tk) == Some(&Tk::Sep) {
                    i += 1;
                    continue;
                }
                let mut alias = path.last().map(|s| s.0.clone());
                if let (Some(Tk::Ident(kw)), Some(Tk::Ident(name))) = (toks.get(i).map(|t| &t.tk), toks.get(i + 1).map(|t| &t.tk))
                    && kw == "as"
                {
                    alias = Some(name.clone());
                    i += 2;
                }
                leaves.push(leaf(&path, alias));
                return i;
            }
            _ => {
                if !path.is_empty() {
                    leaves.push(leaf(&path, None));
                }
                return i;
            }
        }
    }
}
