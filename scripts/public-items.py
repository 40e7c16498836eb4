#!/usr/bin/env python3
"""Counts the gpufeed library's public items from rustdoc's JSON (issue 40's acceptance):

    CARGO_TARGET_DIR=/tmp/rdjson cargo +nightly rustdoc -q -p gpufeed --lib -- \
        -Z unstable-options --output-format json --document-hidden-items
    python3 scripts/public-items.py /tmp/rdjson/doc/gpufeed.json [--paths]

Every item reachable by a public path from the crate root counts once (re-exports followed;
fields, variants and inherent methods with their types), and is hidden when it or a module on
every path to it is `#[doc(hidden)]`; module-level items (what a `use` names) are counted apart.
"""
import collections
import json
import sys

d = json.load(open(sys.argv[1]))
idx = d["index"]
# Walk from the root module through public items, following re-exports within the crate: count
# items reachable by a public path (each item once), and which of them are hidden (doc(hidden)
# on the item or on any module on its path).
seen = {}
def attrs_hidden(it):
    s = json.dumps(it.get("attrs", [])).replace(" ", "")
    return "doc(hidden)" in s or ("hidden" in s and "doc" in s)
def visit(item_id, hidden, modpath):
    it = idx.get(str(item_id))
    if it is None: return
    if it.get("crate_id") != 0: return
    h = hidden or attrs_hidden(it)
    inner = it["inner"]
    kind = next(iter(inner))
    if kind == "use":
        u = inner["use"]
        if u.get("id") is not None:
            visit(u["id"], h, modpath)
        return
    key = str(item_id)
    if key in seen:
        seen[key] = seen[key] and h  # visible anywhere unhidden -> unhidden
        return
    seen[key] = h
    if kind == "module":
        for c in inner["module"]["items"]:
            ci = idx.get(str(c))
            if ci is None: continue
            if ci.get("visibility") == "public":
                visit(c, h, modpath + [it.get("name")])
    elif kind in ("struct","enum","trait","union"):
        sub = inner[kind]
        ids = []
        if kind == "struct":
            k = sub.get("kind", {})
            if isinstance(k, dict) and "plain" in k: ids += k["plain"].get("fields", [])
            elif isinstance(k, dict) and "tuple" in k: ids += [f for f in k["tuple"] if f is not None]
        if kind == "enum": ids += sub.get("variants", [])
        if kind == "trait": ids += sub.get("items", [])
        for imp in sub.get("impls", []) if kind != "trait" else []:
            ii = idx.get(str(imp))
            if ii and ii["inner"]["impl"].get("trait") is None:
                ids += [x for x in ii["inner"]["impl"]["items"] if idx.get(str(x), {}).get("visibility") == "public"]
        for c in ids:
            ci = idx.get(str(c))
            if ci is None: continue
            if kind in ("enum","trait") or ci.get("visibility") == "public":
                visit(c, h, modpath)
visit(d["root"], False, [])
kinds = collections.Counter()
hk = collections.Counter()
for k, h in seen.items():
    kind = next(iter(idx[k]["inner"]))
    kinds[kind] += 1
    if h: hk[kind] += 1
total = sum(kinds.values())
hidden = sum(hk.values())
mods = kinds["module"] - hk["module"]
print(f"public items {total}: documented {total-hidden}, hidden {hidden}; documented modules {mods}")
print(" by kind (all/hidden):", {k: (v, hk[k]) for k, v in sorted(kinds.items())})
# Module-level items only (what a `use` names: no fields, variants or methods).
top = {}
paths = collections.defaultdict(list)  # documented module-level paths to each item
def visit_top(item_id, hidden, path=()):
    it = idx.get(str(item_id))
    if it is None or it.get("crate_id") != 0: return
    h = hidden or attrs_hidden(it)
    inner = it["inner"]; kind = next(iter(inner))
    if kind == "use":
        if inner["use"].get("id") is not None:
            visit_top(inner["use"]["id"], h, path[:-1] + (inner["use"].get("name"),))
        return
    key = str(item_id)
    if not h and path:
        paths[key].append("::".join(path))
    if key in top:
        top[key] = top[key] and h; return
    top[key] = h
    if kind == "module":
        for c in inner["module"]["items"]:
            ci = idx.get(str(c))
            if ci is not None and ci.get("visibility") == "public":
                visit_top(c, h, path + (ci.get("name"),))
visit_top(d["root"], False)
t = len(top); th = sum(1 for v in top.values() if v)
mods = sum(1 for k, v in top.items() if not v and next(iter(idx[k]["inner"])) == "module")
print(f"module-level public items {t}: documented {t-th}, hidden {th}; documented modules {mods}")
multi = {k: v for k, v in paths.items() if len(set(v)) > 1}
print(f"module-level items with more than one documented path: {len(multi)}")
if "--paths" in sys.argv:
    for k, v in sorted(multi.items(), key=lambda kv: sorted(kv[1])):
        print("  " + "  =  ".join(sorted(set(v))))
