#!/usr/bin/env python3
"""Lists the crate's public items from rustdoc's HTML output, one a line.

Every page rustdoc writes under target/doc/admission is a public item at the
path a user names it by (a struct, enum, trait, function, constant, type
alias); on each, the inherent methods and associated items, the pub fields
and the variants are items too, and so are trait methods. A `pub use` that
makes an item reachable by a second path counts as one more. Trait
implementations (Debug, Clone...) and blanket ones are not counted: they
are not the crate's vocabulary.

    python3 scripts/public-items.py                  # the list
    python3 scripts/public-items.py --count          # totals per module
    python3 scripts/public-items.py --check FILE     # fails if the list differs

Run `cargo doc --no-deps` with the features to list first (test-all.sh builds
rustdoc with every feature it tests before it checks the committed list,
docs/public-items.txt; regenerate that with `> docs/public-items.txt`).
"""

import html
import os
import re
import sys
from collections import Counter

CRATE = "admission"
ITEM_PAGE = re.compile(r"^(struct|enum|trait|fn|constant|type|union|static|macro)\.(.+)\.html$")
SECTION_END = re.compile(r'<h2 id="(trait-implementations|synthetic-implementations|blanket-implementations|implementors|dyn-compatibility|object-safety)"')


def inherent_part(page: str) -> str:
    """The page up to where trait implementations begin."""
    end = SECTION_END.search(page)
    return page[: end.start()] if end else page


def expand(use: str):
    """The paths one `pub use` names: `a::{B, C}` is `a::B` and `a::C`."""
    use = use.replace(" ", "").replace("\n", "")
    match = re.match(r"^(.*?)\{(.*)\}$", use)
    if not match:
        return [use]
    prefix, inside = match.groups()
    return [prefix + name for name in inside.split(",") if name]


def items_of(root: str):
    items = []
    module_of = {}
    for directory, _, files in os.walk(root):
        relative = os.path.relpath(directory, os.path.dirname(root))
        module = relative.replace(os.sep, "::")
        for name in files:
            path = os.path.join(directory, name)
            if name == "index.html":
                with open(path, encoding="utf-8") as f:
                    page = f.read()
                for reexport in re.findall(r'<code>pub use (.*?);</code>', page, re.S):
                    text = html.unescape(re.sub(r"<[^>]+>", "", reexport))
                    for name in expand(text):
                        line = f"reexport {module}::{name.split('::')[-1]} = {name}"
                        items.append(line)
                        module_of[line] = module
                continue
            match = ITEM_PAGE.match(name)
            if not match:
                continue
            kind, item = match.groups()
            with open(path, encoding="utf-8") as f:
                page = f.read()
            # rustdoc leaves a redirect where an item of a private module
            # was defined: not a path a user can name.
            if "<title>Redirection</title>" in page or 'http-equiv="refresh"' in page:
                continue
            full = f"{module}::{item}"
            items.append(f"{kind} {full}")
            module_of[f"{kind} {full}"] = module
            page = inherent_part(page)
            for member_kind, member in re.findall(
                r'id="(method|tymethod|associatedconstant|associatedtype|structfield|variant)\.([A-Za-z_0-9]+)"',
                page,
            ):
                label = {"tymethod": "method", "structfield": "field"}.get(member_kind, member_kind)
                items.append(f"{label} {full}::{member}")
                module_of[f"{label} {full}::{member}"] = module
    return sorted(set(items)), module_of


def main(argv):
    root = os.path.join("target", "doc", CRATE)
    if not os.path.isdir(root):
        sys.exit(f"{root} not found: run `cargo doc --no-deps` first")
    items, module_of = items_of(root)
    if "--count" in argv:
        # Per top-level module, fields and variants apart: the surface a
        # reader learns is the items; fields and variants come with them.
        per_module = Counter()
        members = Counter()
        kinds = Counter()
        for line in items:
            kind = line.split(" ", 1)[0]
            parts = module_of[line].split("::")
            module = parts[1] if len(parts) > 1 else "(root)"
            if kind in ("field", "variant"):
                members[module] += 1
            else:
                per_module[module] += 1
            kinds[kind] += 1
        print(f"{'module':12} {'items':>6} {'fields+variants':>16}")
        for module in sorted(set(per_module) | set(members)):
            print(f"{module:12} {per_module[module]:6} {members[module]:16}")
        print(f"{'total':12} {sum(per_module.values()):6} {sum(members.values()):16}")
        print("by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
        return 0
    if "--check" in argv:
        committed_path = argv[argv.index("--check") + 1]
        with open(committed_path, encoding="utf-8") as f:
            committed = [line.rstrip("\n") for line in f if line.strip()]
        added = sorted(set(items) - set(committed))
        removed = sorted(set(committed) - set(items))
        if added or removed:
            for line in added:
                print(f"+ {line}")
            for line in removed:
                print(f"- {line}")
            print(
                f"the public items differ from {committed_path} "
                f"({len(added)} added, {len(removed)} removed): if that is intended, "
                f"regenerate it with `python3 scripts/public-items.py > {committed_path}`"
            )
            return 1
        print(f"{len(items)} public items, as {committed_path} lists them")
        return 0
    print("\n".join(items))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
