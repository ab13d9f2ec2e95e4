//! The crate's top-level modules form layers: no import circle between
//! them. A circle (export reads the queue while the queue calls export)
//! means neither can be read, tested or changed alone; this test reads the
//! `crate::` paths in `src/` and fails, naming the files, on any circle.
//!
//! A file belongs to the top-level module it sits under (`src/queue/*.rs`
//! is `queue`); `crate::Name` for an item the crate root re-exports counts
//! as the module that defines it (read from `src/lib.rs`). Test code
//! (`*tests.rs` files and `#[cfg(test)] mod` blocks) and comments are not
//! read: a test may reach anything. `sync` is the loom seam under every
//! module and is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// Every edge `from -> to` with the files that make it.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// `crate::Name` for each name the root re-exports, mapped to its module:
/// `pub use queue::{Admit, WorkQueue};` maps `Admit` and `WorkQueue` to
/// `queue`.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let mut rest = lib;
    while let Some(start) = rest.find("pub use ") {
        let statement = &rest[start + "pub use ".len()..];
        let end = statement.find(';').unwrap_or(statement.len());
        let statement = &statement[..end];
        rest = &rest[start + 1..];
        let Some((module, items)) = statement.split_once("::") else {
            continue;
        };
        let items = items.trim().trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let item = item.trim();
            let name = item.rsplit(" as ").next().unwrap_or(item).trim();
            if !name.is_empty() {
                names.insert(name.to_owned(), module.trim().to_owned());
            }
        }
    }
    names
}

/// The file's code without comments and test modules.
fn production_code(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        let without_comment = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        code.push_str(without_comment);
        code.push('\n');
    }
    code
}

fn crate_paths(code: &str) -> impl Iterator<Item = &str> {
    code.match_indices("crate::").filter_map(move |(at, _)| {
        let before = code[..at].chars().next_back();
        // `$crate::` in macros, or a longer identifier ending in "crate".
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            return None;
        }
        let rest = &code[at + "crate::".len()..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        (end > 0).then(|| &rest[..end])
    })
}

fn import_graph() -> (BTreeSet<String>, Graph) {
    let src = Path::new(SRC);
    let lib = fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let reexports = root_reexports(&lib);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut modules = BTreeSet::new();
    let mut graph = Graph::new();
    for path in files {
        let relative = path
            .strip_prefix(src)
            .expect("under src/")
            .to_string_lossy()
            .replace('\\', "/");
        if relative == "lib.rs" {
            continue;
        }
        let top = relative
            .split('/')
            .next()
            .expect("a first component")
            .trim_end_matches(".rs")
            .to_owned();
        modules.insert(top.clone());
        if relative.ends_with("tests.rs") {
            continue;
        }
        let code = production_code(&fs::read_to_string(&path).expect("a source file"));
        for name in crate_paths(&code) {
            let target = reexports.get(name).map_or(name, String::as_str);
            if target != top && target != "sync" {
                graph
                    .entry(top.clone())
                    .or_default()
                    .entry(target.to_owned())
                    .or_default()
                    .insert(relative.clone());
            }
        }
    }
    (modules, graph)
}

/// Tarjan's strongly connected components of more than one module.
fn circles(modules: &BTreeSet<String>, graph: &Graph) -> Vec<Vec<String>> {
    struct Search<'g> {
        graph: &'g Graph,
        next: usize,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Search<'g> {
        fn visit(&mut self, module: &'g str) {
            self.index.insert(module, self.next);
            self.low.insert(module, self.next);
            self.next += 1;
            self.stack.push(module);
            self.on_stack.insert(module);
            for target in self.graph.get(module).into_iter().flat_map(|t| t.keys()) {
                let target = target.as_str();
                if !self.index.contains_key(target) {
                    self.visit(target);
                    let low = self.low[module].min(self.low[target]);
                    self.low.insert(module, low);
                } else if self.on_stack.contains(target) {
                    let low = self.low[module].min(self.index[target]);
                    self.low.insert(module, low);
                }
            }
            if self.low[module] == self.index[module] {
                let mut component = Vec::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack.remove(member);
                    component.push(member.to_owned());
                    if member == module {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        next: 0,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for module in modules {
        if !search.index.contains_key(module.as_str()) {
            search.visit(module);
        }
    }
    search.found
}

#[test]
fn no_import_circle_between_top_level_modules() {
    let (modules, graph) = import_graph();
    let found = circles(&modules, &graph);
    let mut report = String::new();
    for circle in &found {
        report.push_str(&format!("circle: {}\n", circle.join(", ")));
        for from in circle {
            for (to, files) in graph.get(from).into_iter().flatten() {
                if circle.contains(to) {
                    let files: Vec<_> = files.iter().map(String::as_str).collect();
                    report.push_str(&format!("  {from} -> {to} ({})\n", files.join(", ")));
                }
            }
        }
    }
    assert!(found.is_empty(), "import circles in src/:\n{report}");
}

#[test]
fn the_search_finds_a_planted_circle() {
    let modules: BTreeSet<String> = ["a", "b", "c", "d"].map(String::from).into();
    let mut graph = Graph::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        graph
            .entry(from.to_owned())
            .or_default()
            .entry(to.to_owned())
            .or_default()
            .insert(format!("{from}.rs"));
    }
    assert_eq!(circles(&modules, &graph), vec![vec!["a", "b", "c"]]);
    graph.get_mut("c").expect("c has edges").remove("a");
    assert!(circles(&modules, &graph).is_empty());
}

#[test]
fn the_reader_maps_root_reexports_and_skips_comments_and_tests() {
    let lib = "pub use queue::{Admit, WorkQueue};\npub use health::ComponentHealth;\n";
    let names = root_reexports(lib);
    assert_eq!(names["WorkQueue"], "queue");
    assert_eq!(names["ComponentHealth"], "health");
    let code = production_code(
        "use crate::export;\n// crate::gpu in a comment\nlet x = $crate::y;\n#[cfg(test)]\nmod tests {\n use crate::tower;\n}\n",
    );
    assert_eq!(crate_paths(&code).collect::<Vec<_>>(), vec!["export"]);
}
