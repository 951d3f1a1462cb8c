//! The server's layout, checked on its source text (std only; it reads the files, it compiles nothing):
//!
//! 1. **Dependencies point one way.** A module imports (by `use`, or by a path from `crate::`, `super::`,
//!    `self::`, a child module or a module it imported) no folder above its own in
//!    front > api > route > leader > apply > election > peer. The leaves import no module of the crate;
//!    only lib.rs imports node.rs; and no module names an item of lib.rs but through its re-exports.
//! 2. **No cycle between files.** Each path resolves to the longest prefix of it that is a module file; a
//!    parent's `mod x;` is not an edge.
//! 3. **Short files and functions.** At most [`FILE_LINES_MAX`] lines in a file of the server before its
//!    tests; at most [`FN_LINES_MAX`] in a function of the server, of the benchmarks, or the simulation's
//!    `run` and `apply`.
//! 4. **docs/ARCHITECTURE.md cites code that exists.** A citation is a code span `path.rs:Name` or
//!    `path.rs:Type::member`, the path relative to the server's `src/` or to the repository's root: the
//!    file must define `Name` (`fn`, `struct`, `enum`, `trait`, `const`, `type`, `mod`, `static`), or have
//!    `member` as a `fn`, `const` or `type` in an `impl` or `trait` of `Type`, or as a variant of
//!    `enum Type`. A code span that is a path ending in `.rs` must name a file that exists.
//!
//! Code is read as tokens, with comments, strings and character literals blanked out, and without its
//! `#[cfg(test)] mod` blocks (tests may reach anywhere). Each checker is shown to catch what it looks for on
//! an inline example, at the end of this file.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The folders, in the order a request passes them: each may use only those after it.
const ORDER: [&str; 7] = ["front", "api", "route", "leader", "apply", "election", "peer"];
/// Modules below every folder that import no module of the crate.
const LEAVES: [&str; 8] = ["metrics", "tls", "clock", "random", "state", "faults", "load", "purge"];
/// The crate root (lib.rs, whose module path is empty) and the node that it builds, above everything.
const LIB: &str = "lib";
const NODE: &str = "node";
/// Lines a file of the server may have before its tests.
const FILE_LINES_MAX: usize = 700;
/// Lines a function may have, from the line of its `fn` to its closing brace.
const FN_LINES_MAX: usize = 80;

// ---------------------------------------------------------------------------------------------------
// The checks, on the repository as it is.
// ---------------------------------------------------------------------------------------------------

#[test]
fn no_module_imports_a_folder_above_it() {
    let errors = layer_errors(&Crate::new(server_sources()));
    assert!(
        errors.is_empty(),
        "the server's folders may use only those below them ({}), the leaves ({}) nothing of the crate, and \
         only lib.rs may use node.rs (docs/ARCHITECTURE.md, \"The server's dependency rule\"):\n{}",
        ORDER.join(" > "),
        LEAVES.join(", "),
        errors.join("\n")
    );
}

#[test]
fn no_two_files_use_each_other() {
    let cycles = cycles(&Crate::new(server_sources()));
    assert!(
        cycles.is_empty(),
        "files of the server use each other; one of them holds two things (docs/ARCHITECTURE.md, \"The \
         server's dependency rule\"):\n{}",
        cycles.join("\n")
    );
}

#[test]
fn no_server_file_is_longer_than_700_lines_before_its_tests() {
    let long: Vec<String> = server_sources()
        .iter()
        .filter(|source| source.lines > FILE_LINES_MAX)
        .map(|source| format!("{}: {} lines before its tests", source.path, source.lines))
        .collect();
    assert!(long.is_empty(), "files longer than {FILE_LINES_MAX} lines:\n{}", long.join("\n"));
}

#[test]
fn no_function_is_longer_than_80_lines() {
    let root = repo_root();
    let mut sources = server_sources();
    let bench = root.join("crates/holdfast/src");
    sources.push(read_source(&root, &bench.join("bench.rs"), Vec::new()));
    sources.extend(rust_files(&bench.join("bench")).iter().map(|file| read_source(&root, file, Vec::new())));
    let sim = read_source(&root, &root.join("crates/holdfast-sim/src/sim.rs"), Vec::new());
    let mut long: Vec<String> = sources.iter().flat_map(|source| long_functions(source, |_| true)).collect();
    long.extend(long_functions(&sim, |name| name == "run" || name == "apply"));
    assert!(long.is_empty(), "functions longer than {FN_LINES_MAX} lines:\n{}", long.join("\n"));
}

#[test]
fn architecture_md_cites_only_code_that_exists() {
    let root = repo_root();
    let doc = fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md");
    let errors = citation_errors("docs/ARCHITECTURE.md", &doc, &|path| {
        let server = root.join("crates/holdfast-server/src").join(path);
        fs::read_to_string(server).or_else(|_| fs::read_to_string(root.join(path))).ok()
    });
    assert!(
        errors.is_empty(),
        "docs/ARCHITECTURE.md cites what does not exist (a citation is `path.rs:Name` or \
         `path.rs:Type::member`, the path from crates/holdfast-server/src or from the repository's root):\n{}",
        errors.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------------
// Reading the sources.
// ---------------------------------------------------------------------------------------------------

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`, in order.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// Every source file of the server crate, with its module path.
fn server_sources() -> Vec<Source> {
    let root = repo_root();
    let src = root.join("crates/holdfast-server/src");
    rust_files(&src)
        .iter()
        .map(|file| {
            let relative = file.strip_prefix(&src).expect("under src").to_string_lossy().replace('\\', "/");
            read_source(&root, file, module_path(&relative))
        })
        .collect()
}

fn read_source(root: &Path, file: &Path, module: Vec<String>) -> Source {
    let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let shown = file.strip_prefix(root).unwrap_or(file).to_string_lossy().into_owned();
    Source::new(shown, module, &text)
}

/// The module path of the file at `relative` (from the crate's `src/`): `[]` for lib.rs, `["route"]` for
/// route/mod.rs, `["route", "gather"]` for route/gather.rs.
fn module_path(relative: &str) -> Vec<String> {
    let mut segments: Vec<String> = relative.trim_end_matches(".rs").split('/').map(str::to_owned).collect();
    if segments.last().is_some_and(|last| last == "mod" || last == "lib") {
        segments.pop();
    }
    segments
}

/// A word or a punctuation mark of code, and the line it is on (from 1).
#[derive(Debug, Clone)]
struct Token {
    text: String,
    line: usize,
}

/// A source file read as code.
struct Source {
    /// Its path, as messages show it.
    path: String,
    /// Its module path (see [`module_path`]).
    module: Vec<String>,
    /// Its code outside `#[cfg(test)] mod` blocks.
    code: Vec<Token>,
    /// Its lines outside those blocks.
    lines: usize,
}

impl Source {
    fn new(path: String, module: Vec<String>, text: &str) -> Self {
        let tokens = tokens(&blank_literals(text));
        let (code, test_lines) = without_tests(tokens);
        Source { path, module, code, lines: text.lines().count() - test_lines }
    }

    /// The top module it belongs to: its folder, a leaf, node, or lib.
    fn unit(&self) -> &str {
        unit(&self.module)
    }
}

fn unit(module: &[String]) -> &str {
    module.first().map_or(LIB, String::as_str)
}

fn is_word(text: &str) -> bool {
    text.chars().next().is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// `text` with comments and the contents of string and character literals replaced by spaces (newlines
/// kept, so lines still count): what is left is code, whose braces and paths mean what they say.
fn blank_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let word = |i: usize| i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_');
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, from: usize, to: usize| {
        out.extend(chars[from..to.min(chars.len())].iter().map(|&c| if c == '\n' { '\n' } else { ' ' }))
    };
    let mut i = 0;
    while i < chars.len() {
        let at = |k: usize| chars.get(k).copied();
        let end = if at(i) == Some('/') && at(i + 1) == Some('/') {
            (i..chars.len()).find(|&k| chars[k] == '\n').unwrap_or(chars.len())
        } else if at(i) == Some('/') && at(i + 1) == Some('*') {
            let (mut k, mut depth) = (i, 0);
            while k < chars.len() {
                if at(k) == Some('/') && at(k + 1) == Some('*') {
                    depth += 1;
                    k += 2;
                } else if at(k) == Some('*') && at(k + 1) == Some('/') {
                    depth -= 1;
                    k += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    k += 1;
                }
            }
            k
        } else if at(i) == Some('r') && (i == 0 || !word(i - 1) || (chars[i - 1] == 'b' && (i < 2 || !word(i - 2)))) {
            // A raw string, r"…" or r#"…"#, if the quote follows the hashes.
            let hashes = (i + 1..chars.len()).take_while(|&k| chars[k] == '#').count();
            if at(i + 1 + hashes) != Some('"') {
                out.push('r');
                i += 1;
                continue;
            }
            let closing: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let body = i + 2 + hashes;
            (body..chars.len()).find(|&k| chars[k..].starts_with(&closing)).map_or(chars.len(), |k| k + closing.len())
        } else if at(i) == Some('"') {
            let mut k = i + 1;
            while k < chars.len() && chars[k] != '"' {
                k += if chars[k] == '\\' { 2 } else { 1 };
            }
            k + 1
        } else if at(i) == Some('\'') && at(i + 1) == Some('\\') {
            (i + 3..chars.len()).find(|&k| chars[k] == '\'').map_or(chars.len(), |k| k + 1)
        } else if at(i) == Some('\'') && at(i + 2) == Some('\'') {
            i + 3
        } else {
            // Code, or the tick of a lifetime.
            out.push(chars[i]);
            i += 1;
            continue;
        };
        blank(&mut out, i, end);
        i = end;
    }
    out
}

/// The words and punctuation of `code` (`::` is one token).
fn tokens(code: &str) -> Vec<Token> {
    let chars: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(Token { text: chars[start..i].iter().collect(), line });
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push(Token { text: "::".into(), line });
            i += 2;
        } else {
            tokens.push(Token { text: c.to_string(), line });
            i += 1;
        }
    }
    tokens
}

fn text(code: &[Token], i: usize) -> &str {
    code.get(i).map_or("", |token| token.text.as_str())
}

/// The index of the brace that closes the one at `open`.
fn closing_brace(code: &[Token], open: usize) -> usize {
    let mut depth = 0;
    for (i, token) in code.iter().enumerate().skip(open) {
        match token.text.as_str() {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    code.len().saturating_sub(1)
}

/// `tokens` without the `#[cfg(test)] mod name { … }` blocks, and how many lines those took.
fn without_tests(tokens: Vec<Token>) -> (Vec<Token>, usize) {
    const TEST_MOD: [&str; 7] = ["#", "[", "cfg", "(", "test", ")", "]"];
    let mut code = Vec::with_capacity(tokens.len());
    let mut test_lines = 0;
    let mut i = 0;
    while i < tokens.len() {
        let is_test_mod = TEST_MOD.iter().enumerate().all(|(k, t)| text(&tokens, i + k) == *t)
            && text(&tokens, i + 7) == "mod"
            && text(&tokens, i + 9) == "{";
        if is_test_mod {
            let close = closing_brace(&tokens, i + 9);
            test_lines += tokens[close].line - tokens[i].line + 1;
            i = close + 1;
        } else {
            code.push(tokens[i].clone());
            i += 1;
        }
    }
    (code, test_lines)
}

// ---------------------------------------------------------------------------------------------------
// Check 1 and 2: what each file uses, resolved to module files.
// ---------------------------------------------------------------------------------------------------

/// A path as written in a `use` or in code, and the name a `use` binds it to.
#[derive(Debug)]
struct Written {
    segments: Vec<String>,
    binding: Option<String>,
    line: usize,
}

/// One file's use of a module file of the crate.
struct Use {
    /// The index of the using source.
    from: usize,
    /// The module file used (`[]`: an item of lib.rs itself).
    to: Vec<String>,
    /// The path as written, and its line.
    written: String,
    line: usize,
}

/// The server crate: its sources, and every use of one module file by another.
struct Crate {
    sources: Vec<Source>,
    modules: BTreeSet<Vec<String>>,
    /// What lib.rs's `use`s bind (its re-exports): the absolute path, or `None` for another crate's.
    lib_names: BTreeMap<String, Option<Vec<String>>>,
    uses: Vec<Use>,
}

impl Crate {
    fn new(sources: Vec<Source>) -> Self {
        let modules = sources.iter().map(|source| source.module.clone()).collect();
        let mut krate = Crate { sources, modules, lib_names: BTreeMap::new(), uses: Vec::new() };
        if let Some(lib) = krate.sources.iter().find(|source| source.module.is_empty()) {
            let (imports, _) = use_paths(&lib.code);
            let lib_names: BTreeMap<_, _> = imports
                .iter()
                .filter_map(|import| {
                    let name = import.binding.clone()?;
                    Some((name, krate.absolute(&[], &BTreeMap::new(), &import.segments)))
                })
                .collect();
            krate.lib_names = lib_names;
        }
        krate.uses = (0..krate.sources.len()).flat_map(|from| krate.uses_of(from)).collect();
        krate
    }

    /// The modules source `from` uses: by its `use`s, then by the paths in its code that start at `crate`,
    /// `super`, `self`, a child module or a module one of its `use`s named.
    fn uses_of(&self, from: usize) -> Vec<Use> {
        let source = &self.sources[from];
        let (imports, in_use) = use_paths(&source.code);
        let no_aliases = BTreeMap::new();
        let aliases: BTreeMap<String, Vec<String>> = imports
            .iter()
            .filter_map(|import| {
                let absolute = self.absolute(&source.module, &no_aliases, &import.segments)?;
                Some((import.binding.clone()?, absolute)).filter(|(_, path)| self.modules.contains(path))
            })
            .collect();
        let mut written = imports;
        written.extend(code_paths(&source.code, &in_use));
        written
            .into_iter()
            .filter_map(|path| {
                let absolute = self.absolute(&source.module, &aliases, &path.segments)?;
                let to = self.module_file(absolute)?;
                Some(Use { from, to, written: path.segments.join("::"), line: path.line })
            })
            .filter(|used| used.to != source.module)
            .collect()
    }

    /// `segments`, written in module `from`, as a path from the crate root; `None` for another crate's.
    fn absolute(
        &self,
        from: &[String],
        aliases: &BTreeMap<String, Vec<String>>,
        segments: &[String],
    ) -> Option<Vec<String>> {
        let first = segments.first()?.as_str();
        let child: Vec<String> = from.iter().cloned().chain([first.to_owned()]).collect();
        let (mut base, mut rest) = match first {
            "crate" => (Vec::new(), &segments[1..]),
            "super" => (from[..from.len().saturating_sub(1)].to_vec(), &segments[1..]),
            "self" => (from.to_vec(), &segments[1..]),
            _ if self.modules.contains(&child) => (from.to_vec(), segments),
            _ => (aliases.get(first)?.clone(), &segments[1..]),
        };
        while rest.first().is_some_and(|segment| segment == "super") {
            base.pop();
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The module file an absolute path names: through lib.rs's re-exports, the longest prefix of it that
    /// is a module file (`[]` for an item of lib.rs itself); `None` for a re-export of another crate's.
    fn module_file(&self, mut path: Vec<String>) -> Option<Vec<String>> {
        let top_is_module = path.first().is_some_and(|top| self.modules.contains(&vec![top.clone()]));
        if !top_is_module {
            if let Some(exported) = path.first().and_then(|top| self.lib_names.get(top)) {
                path = exported.clone()?.into_iter().chain(path.into_iter().skip(1)).collect();
            }
        }
        (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|prefix| self.modules.contains(prefix))
    }
}

/// Every path `code`'s `use` items import, with the name each binds; and the indexes of their tokens.
fn use_paths(code: &[Token]) -> (Vec<Written>, BTreeSet<usize>) {
    let mut imports = Vec::new();
    let mut in_use = BTreeSet::new();
    for (i, token) in code.iter().enumerate() {
        if token.text != "use" || (i > 0 && text(code, i - 1) == "::") {
            continue;
        }
        let end = (i..code.len()).find(|&k| code[k].text == ";").unwrap_or(code.len());
        in_use.extend(i..=end);
        let mut at = i + 1;
        use_tree(&code[..end], &mut at, Vec::new(), &mut imports);
    }
    (imports, in_use)
}

/// Reads one use tree at `at` (`a::b`, `a::{b, c::d as e, self}`, `a::*`) below `prefix`.
fn use_tree(code: &[Token], at: &mut usize, mut prefix: Vec<String>, out: &mut Vec<Written>) {
    if text(code, *at) == "::" {
        *at += 1;
    }
    while *at < code.len() {
        let word = text(code, *at).to_owned();
        let line = code[*at].line;
        *at += 1;
        match word.as_str() {
            "{" => {
                while *at < code.len() && text(code, *at) != "}" {
                    let before = *at;
                    use_tree(code, at, prefix.clone(), out);
                    if text(code, *at) == "," || *at == before {
                        *at += 1;
                    }
                }
                *at += 1;
                return;
            }
            "*" => return out.push(Written { segments: prefix, binding: None, line }),
            _ if is_word(&word) && text(code, *at) == "::" => {
                prefix.push(word);
                *at += 1;
            }
            _ if is_word(&word) => {
                let name = if word == "self" { prefix.last().cloned() } else { Some(word.clone()) };
                if word != "self" {
                    prefix.push(word);
                }
                let binding = match text(code, *at) {
                    "as" => {
                        *at += 2;
                        Some(text(code, *at - 1).to_owned())
                    }
                    _ => name,
                };
                return out.push(Written { segments: prefix, binding, line });
            }
            _ => return,
        }
    }
}

/// Every path in `code` outside `use` items (the tokens `in_use`) that starts with a word and `::`.
/// Which of them name the crate's modules is for [`Crate::absolute`] to say.
fn code_paths(code: &[Token], in_use: &BTreeSet<usize>) -> Vec<Written> {
    let mut paths = Vec::new();
    for i in 0..code.len() {
        let starts = is_word(text(code, i))
            && text(code, i + 1) == "::"
            && !in_use.contains(&i)
            && (i == 0 || !matches!(text(code, i - 1), "::" | "." | "$"));
        if !starts {
            continue;
        }
        let mut segments = vec![code[i].text.clone()];
        let mut k = i + 1;
        while text(code, k) == "::" && is_word(text(code, k + 1)) {
            segments.push(code[k + 1].text.clone());
            k += 2;
        }
        paths.push(Written { segments, binding: None, line: code[i].line });
    }
    paths
}

/// Why a module of unit `from` may not use one of unit `to`; `None` if it may.
fn layer_error(from: &str, to: &str) -> Option<String> {
    let rank = |unit: &str| ORDER.iter().position(|folder| *folder == unit);
    let known = |unit: &str| unit == LIB || unit == NODE || LEAVES.contains(&unit) || rank(unit).is_some();
    if let Some(unknown) = [from, to].into_iter().find(|unit| !known(unit)) {
        return Some(format!("`{unknown}` has no place in the layout: add it to ORDER or LEAVES in this test"));
    }
    if from == to || from == LIB {
        return None;
    }
    if LEAVES.contains(&from) {
        return Some(format!("{from} is a leaf, which imports no module of the crate"));
    }
    match to {
        LIB => Some("an item of lib.rs itself: below lib.rs, only its re-exports may be named".into()),
        NODE => Some("node.rs is the wiring: only lib.rs uses it".into()),
        _ if from == NODE || LEAVES.contains(&to) => None,
        _ if rank(to) < rank(from) => Some(format!("{to} is above {from}")),
        _ => None,
    }
}

/// Every use that breaks the dependency rule, as `file:line: what`.
fn layer_errors(krate: &Crate) -> Vec<String> {
    let mut errors: Vec<String> = krate
        .sources
        .iter()
        .filter_map(|source| layer_error(source.unit(), source.unit()).map(|why| format!("{}: {why}", source.path)))
        .collect();
    for used in &krate.uses {
        let source = &krate.sources[used.from];
        if let Some(why) = layer_error(source.unit(), unit(&used.to)) {
            errors.push(format!("{}:{}: {} uses `{}`: {why}", source.path, used.line, source.unit(), used.written));
        }
    }
    errors.dedup();
    errors
}

/// Every cycle in the graph of files that use each other, each as `a.rs:line `path` → b.rs:line … → a.rs`.
fn cycles(krate: &Crate) -> Vec<String> {
    let index: BTreeMap<&Vec<String>, usize> =
        krate.sources.iter().enumerate().map(|(i, source)| (&source.module, i)).collect();
    // The first use of each file by each other, by index.
    let mut edges: BTreeMap<usize, BTreeMap<usize, &Use>> = BTreeMap::new();
    for used in &krate.uses {
        if let Some(&to) = index.get(&used.to) {
            edges.entry(used.from).or_default().entry(to).or_insert(used);
        }
    }
    let mut found = Vec::new();
    let mut seen_cycles = BTreeSet::new();
    let mut done = vec![false; krate.sources.len()];
    for start in 0..krate.sources.len() {
        let mut stack = Vec::new();
        visit(start, &edges, &mut stack, &mut done, &mut |cycle: &[usize]| {
            let mut members = cycle.to_vec();
            members.sort_unstable();
            if !seen_cycles.insert(members) {
                return;
            }
            let steps: Vec<String> = cycle
                .iter()
                .zip(cycle.iter().cycle().skip(1))
                .map(|(&from, &to)| {
                    let used = edges[&from][&to];
                    format!("{}:{} `{}`", krate.sources[from].path, used.line, used.written)
                })
                .collect();
            found.push(format!("{} → back to {}", steps.join(" → "), krate.sources[cycle[0]].path));
        });
    }
    found
}

/// Depth first from `node`; `on_cycle` is told each cycle met, as the files in it from its first.
fn visit(
    node: usize,
    edges: &BTreeMap<usize, BTreeMap<usize, &Use>>,
    stack: &mut Vec<usize>,
    done: &mut [bool],
    on_cycle: &mut dyn FnMut(&[usize]),
) {
    if let Some(at) = stack.iter().position(|&n| n == node) {
        return on_cycle(&stack[at..]);
    }
    if done[node] {
        return;
    }
    stack.push(node);
    for &next in edges.get(&node).map(|next| next.keys()).into_iter().flatten() {
        visit(next, edges, stack, done, on_cycle);
    }
    stack.pop();
    done[node] = true;
}

// ---------------------------------------------------------------------------------------------------
// Check 3: long functions.
// ---------------------------------------------------------------------------------------------------

/// Every function of `source` outside its tests: the line of its `fn`, its name, and its length in lines
/// to its closing brace.
fn functions(source: &Source) -> Vec<(usize, String, usize)> {
    let code = &source.code;
    let mut functions = Vec::new();
    for i in 0..code.len() {
        if text(code, i) != "fn" || !is_word(text(code, i + 1)) {
            continue;
        }
        // The body's brace, unless a `;` ends a declaration first (`[u8; 32]` is inside brackets).
        let mut depth = 0i32;
        let mut body = None;
        for (k, token) in code.iter().enumerate().skip(i + 2) {
            match token.text.as_str() {
                "(" | "[" => depth += 1,
                ")" | "]" => depth -= 1,
                "{" if depth == 0 => {
                    body = Some(k);
                    break;
                }
                ";" if depth == 0 => break,
                _ => {}
            }
        }
        let Some(open) = body else { continue };
        let lines = code[closing_brace(code, open)].line - code[i].line + 1;
        functions.push((code[i].line, code[i + 1].text.clone(), lines));
    }
    functions
}

/// The functions of `source` whose names `named` picks that are longer than [`FN_LINES_MAX`], as
/// `file:line fn name: N lines`.
fn long_functions(source: &Source, named: impl Fn(&str) -> bool) -> Vec<String> {
    functions(source)
        .into_iter()
        .filter(|(_, name, lines)| *lines > FN_LINES_MAX && named(name))
        .map(|(line, name, lines)| format!("{}:{line} fn {name}: {lines} lines", source.path))
        .collect()
}

// ---------------------------------------------------------------------------------------------------
// Check 4: citations in a document.
// ---------------------------------------------------------------------------------------------------

/// What `doc` (named `name`) cites that does not exist, as `name:line: why`; `read` answers a cited
/// file's text.
fn citation_errors(name: &str, doc: &str, read: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let mut errors = Vec::new();
    // Each cited file read as code once: `None` if it does not exist.
    let mut files: BTreeMap<String, Option<Vec<Token>>> = BTreeMap::new();
    for (line, span) in code_spans(doc) {
        let (path, item) = match span.split_once(':') {
            Some((path, item)) if path.ends_with(".rs") => (path, Some(item)),
            _ if span.ends_with(".rs") => (span.as_str(), None),
            _ => continue,
        };
        if !path.chars().all(|c| c.is_alphanumeric() || "_-./".contains(c)) {
            continue;
        }
        let file =
            files.entry(path.to_owned()).or_insert_with(|| read(path).map(|text| tokens(&blank_literals(&text))));
        let Some(code) = file else {
            errors.push(format!("{name}:{line}: `{span}`: no such file"));
            continue;
        };
        let Some(item) = item else { continue };
        let well_formed = item.split("::").all(is_word) && item.split("::").count() <= 2;
        if !well_formed {
            errors.push(format!("{name}:{line}: `{span}`: a citation names `Name` or `Type::member`"));
        } else if !defines(code, item) {
            errors.push(format!("{name}:{line}: `{span}`: {path} does not define `{item}`"));
        }
    }
    errors
}

/// The inline code spans of a markdown document outside its fenced blocks, with the line each starts on.
fn code_spans(doc: &str) -> Vec<(usize, String)> {
    let mut spans = Vec::new();
    let mut fenced = false;
    let mut paragraph: Vec<(usize, &str)> = Vec::new();
    let lines = doc.lines().chain([""]).enumerate();
    for (n, line) in lines {
        let fence = line.trim_start().starts_with("```");
        if !line.trim().is_empty() && !fence && !fenced {
            paragraph.push((n + 1, line));
            continue;
        }
        fenced ^= fence;
        // A paragraph ends: its spans, each on the line its opening tick is on.
        let mut inside = false;
        for (number, text) in paragraph.drain(..) {
            for (k, part) in text.split('`').enumerate() {
                if k > 0 {
                    inside = !inside;
                }
                if inside {
                    match spans.last_mut() {
                        Some((_, open)) if k == 0 => *open = format!("{open} {part}"),
                        _ => spans.push((number, part.to_owned())),
                    }
                }
            }
        }
    }
    spans
}

/// Whether `code` defines `item`: `Name`, or `Type::member` (see the module's doc).
fn defines(code: &[Token], item: &str) -> bool {
    const ITEMS: [&str; 8] = ["fn", "struct", "enum", "trait", "const", "type", "mod", "static"];
    let declares = |range: &[Token], name: &str, kinds: &[&str]| {
        range.windows(2).any(|pair| kinds.contains(&pair[0].text.as_str()) && pair[1].text == name)
    };
    let Some((ty, member)) = item.split_once("::") else { return declares(code, item, &ITEMS) };
    // The bodies of `impl … Type … { }`, `trait Type { }` and `enum Type { }` in the file.
    let mut members = false;
    for i in 0..code.len() {
        let kind = text(code, i);
        if !matches!(kind, "impl" | "trait" | "enum") {
            continue;
        }
        let Some(open) = (i + 1..code.len()).find(|&k| matches!(text(code, k), "{" | ";")) else { continue };
        let names_type = match kind {
            "impl" => code[i + 1..open].iter().any(|token| token.text == ty),
            _ => text(code, i + 1) == ty,
        };
        if !names_type || text(code, open) != "{" {
            continue;
        }
        let body = &code[open..=closing_brace(code, open)];
        members |= match kind {
            "enum" => {
                body.windows(2).any(|pair| matches!(pair[0].text.as_str(), "{" | "," | "]") && pair[1].text == member)
            }
            _ => declares(body, member, &["fn", "const", "type"]),
        };
    }
    members
}

// ---------------------------------------------------------------------------------------------------
// Each checker catches what it looks for.
// ---------------------------------------------------------------------------------------------------

/// A crate of the inline `files` (path from `src/`, text).
fn inline_crate(files: &[(&str, &str)]) -> Crate {
    Crate::new(files.iter().map(|(path, text)| Source::new(path.to_string(), module_path(path), text)).collect())
}

#[test]
fn the_layer_check_catches_a_folder_that_uses_one_above_it() {
    let krate = inline_crate(&[
        ("lib.rs", "pub mod api; pub mod leader; pub mod node; pub mod state;\npub use node::Node;\n"),
        ("api/mod.rs", "use crate::leader::Leader;\npub struct Api;\n"),
        // Through a `use` of a group, and a path in code: the leader reaches up to the API.
        ("leader/mod.rs", "use crate::{state, api::Api};\npub struct Leader;\nfn f() { crate::api::g(); }\n"),
        // A leaf that imports the crate; a use of node from below, through lib.rs's re-export.
        ("state.rs", "pub fn read() { super::leader::Leader; }\n"),
        ("node.rs", "use crate::api::Api; use crate::leader;\npub struct Node;\n"),
        ("api/admin.rs", "use crate::Node;\n#[cfg(test)]\nmod tests {\n    use crate::node::Node;\n}\n"),
    ]);
    assert_eq!(
        layer_errors(&krate),
        [
            "leader/mod.rs:1: leader uses `crate::api::Api`: api is above leader",
            "leader/mod.rs:3: leader uses `crate::api::g`: api is above leader",
            "state.rs:1: state uses `super::leader::Leader`: state is a leaf, which imports no module of the crate",
            "api/admin.rs:1: api uses `crate::Node`: node.rs is the wiring: only lib.rs uses it",
        ]
    );
}

#[test]
fn the_layer_check_catches_an_item_of_lib_rs_and_a_module_it_does_not_know() {
    let krate = inline_crate(&[
        ("lib.rs", "pub mod peer; pub mod cache;\npub struct Config;\npub use holdfast_core::limits;\n"),
        ("peer/mod.rs", "use crate::limits::NAME_LEN_MAX;\nfn f(c: crate::Config) {}\n"),
        ("cache.rs", "pub struct Cache;\n"),
    ]);
    assert_eq!(
        layer_errors(&krate),
        [
            "cache.rs: `cache` has no place in the layout: add it to ORDER or LEAVES in this test",
            "peer/mod.rs:2: peer uses `crate::Config`: an item of lib.rs itself: below lib.rs, only its \
             re-exports may be named",
        ]
    );
}

#[test]
fn the_cycle_check_catches_files_that_use_each_other() {
    let krate = inline_crate(&[
        ("lib.rs", "pub mod route;\n"),
        ("route/mod.rs", "pub mod gather; pub mod forward;\nuse self::gather::Gather;\npub struct Router;\n"),
        ("route/gather.rs", "pub struct Gather;\nfn f() { forward::send() }\nuse super::forward;\n"),
        ("route/forward.rs", "use super::Router;\npub fn send() {}\n"),
    ]);
    assert_eq!(
        cycles(&krate),
        ["route/mod.rs:2 `self::gather::Gather` → route/gather.rs:3 `super::forward` → route/forward.rs:1 \
          `super::Router` → back to route/mod.rs"]
    );
    // Without the forward's use of its parent, nothing is left of the cycle; `mod` lines are no uses.
    let krate = inline_crate(&[
        ("lib.rs", "pub mod route;\n"),
        ("route/mod.rs", "pub mod gather; pub mod forward;\nuse self::gather::Gather;\npub struct Router;\n"),
        ("route/gather.rs", "pub struct Gather;\nuse super::forward;\n"),
        ("route/forward.rs", "pub fn send() {}\n"),
    ]);
    assert!(cycles(&krate).is_empty());
}

#[test]
fn the_length_check_measures_a_function_to_its_closing_brace_past_braces_in_text() {
    let body = "    let s = \"}\"; // }\n".repeat(FN_LINES_MAX - 2);
    let at_limit = format!("fn short(a: [u8; 2]) {{\n{body}}}\n");
    let over = format!("/* fn not_a_fn() {{ */\nfn long() {{\n{body}    let c = '}}';\n}}\n");
    let source = |text: &str| Source::new("x.rs".into(), Vec::new(), text);
    assert_eq!(functions(&source(&at_limit)), [(1, "short".to_owned(), FN_LINES_MAX)]);
    assert_eq!(long_functions(&source(&over), |_| true), [format!("x.rs:2 fn long: {} lines", FN_LINES_MAX + 1)]);
    assert!(long_functions(&source(&over), |name| name == "run").is_empty());
    // Tests do not count, in a function's length or a file's.
    let tested = format!("fn f() {{}}\n#[cfg(test)]\nmod tests {{\n{over}}}\n");
    assert_eq!(functions(&source(&tested)), [(1, "f".to_owned(), 1)]);
    assert_eq!(source(&tested).lines, 1);
}

#[test]
fn the_citation_check_catches_a_missing_name_a_wrong_type_and_a_missing_file() {
    let files = BTreeMap::from([
        (
            "route/mod.rs",
            "pub struct Router;\nimpl Router {\n    pub async fn write(&self) {}\n}\nconst SENDERS: usize = 4;\n",
        ),
        ("peer/protocol.rs", "pub enum Call {\n    #[doc = \"x\"]\n    Forward,\n    Barrier(u64),\n}\n"),
        ("route/forward.rs", "impl super::Router {\n    fn through_leader() {}\n}\n"),
        ("node.rs", "pub struct Node;\n"),
    ]);
    let doc = "# A doc\n\nA write goes `route/mod.rs:Router::write`, then `route/forward.rs:Router::through_leader`,\n\
               across `route/mod.rs:SENDERS` `peer/protocol.rs:Call::Barrier` senders, not\n\
               `node.rs:Node::write_here` nor `route/mod.rs:Router::serve` nor `node.rs:write_here`.\n\n\
               ```text\n`lib.rs:not_checked` in a fenced block\n```\n\n\
               See `route/gather.rs` and `peer/protocol.rs`, and `route/mod.rs:Router::a::b`.\n";
    let errors = citation_errors("doc.md", doc, &|path| files.get(path).map(|text| text.to_string()));
    assert_eq!(
        errors,
        [
            "doc.md:5: `node.rs:Node::write_here`: node.rs does not define `Node::write_here`",
            "doc.md:5: `route/mod.rs:Router::serve`: route/mod.rs does not define `Router::serve`",
            "doc.md:5: `node.rs:write_here`: node.rs does not define `write_here`",
            "doc.md:11: `route/gather.rs`: no such file",
            "doc.md:11: `route/mod.rs:Router::a::b`: a citation names `Name` or `Type::member`",
        ]
    );
}
