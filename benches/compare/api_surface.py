#!/usr/bin/env python3
"""Which public names of SPDL 0.8.0 spdl_rs lacks, per module, and whether the README lists each gap.

SPDL and spdl_rs live in different virtual environments (SPDL's in ``.venv-peers``, made by
``benches/compare/run.sh``; spdl_rs's in ``.venv``), so each side is listed by its own interpreter in a child
process and the lists are compared here. A module's public names are its ``__all__`` entries that exist (SPDL's
``spdl.pipeline.defs`` lists a few private type aliases there). For every name both have, the parameters of
callables are compared too: a parameter SPDL takes that spdl_rs does not is reported
(private ``_``-prefixed ones aside).

Exit status 1 if a missing name is not on README.md's "Not carried over from SPDL" list (one bullet per gap,
naming it as ```spdl.module.Name```), else 0.

``--snapshot FILE`` also writes SPDL's names and parameters as JSON: ``crates/spdl-py/tests/test_api_surface.py``
checks spdl_rs against that file in CI, where SPDL itself is not installed.

Run through ``cargo xtask compare`` (after the image comparison), or directly::

    python3 benches/compare/api_surface.py [--spdl-python .venv-peers/bin/python] [--spdl-rs-python .venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The modules compared, as SPDL names them; spdl_rs's are the same with ``spdl`` replaced by ``spdl_rs``.
MODULES = [
    "spdl.pipeline",
    "spdl.pipeline.defs",
    "spdl.pipeline.config",
    "spdl.source",
    "spdl.source.utils",
    "spdl.source.imagenet",
    "spdl.dataloader",
    "spdl.io",
]

README_SECTION = "## Not carried over from SPDL"

#: Classes that SPDL constructs itself (``build_pipeline`` makes the ``Pipeline``): their constructor's parameters
#: are not part of the API users call.
INTERNAL_CONSTRUCTORS = {"spdl.pipeline.Pipeline"}

# Runs in SPDL's interpreter: every public name of each module, with the parameters of callables.
_LIST_SPDL = r"""
import importlib, inspect, json, sys
out = {}
for name in json.loads(sys.argv[1]):
    mod = importlib.import_module(name)
    names = {}
    for attr in getattr(mod, "__all__", [n for n in dir(mod) if not n.startswith("_")]):
        if attr.startswith("_") or not hasattr(mod, attr):
            continue
        obj = getattr(mod, attr)
        params = None
        if callable(obj) and not inspect.ismodule(obj):
            try:
                params = [p.name for p in inspect.signature(obj).parameters.values()
                          if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"]
            except (TypeError, ValueError):
                params = None
        names[attr] = params
    out[name] = names
print(json.dumps(out))
"""

# Runs in spdl_rs's interpreter: for each SPDL name, whether spdl_rs has it (and its parameters), or why not.
_PROBE_SPDL_RS = r"""
import importlib, inspect, json, sys
wanted = json.loads(sys.stdin.read())
out = {}
for name, attrs in wanted.items():
    rs_name = "spdl_rs" + name[len("spdl"):]
    res = {}
    try:
        mod = importlib.import_module(rs_name)
    except Exception as e:
        out[name] = {"error": f"{type(e).__name__}: {e}"}
        continue
    for attr in attrs:
        try:
            obj = getattr(mod, attr)
        except Exception as e:
            res[attr] = {"missing": f"{type(e).__name__}: {e}"}
            continue
        params = None
        var_kw = False
        if callable(obj) and not inspect.ismodule(obj):
            try:
                sig = inspect.signature(obj)
                params = [p.name for p in sig.parameters.values()
                          if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"]
                var_kw = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
            except (TypeError, ValueError):
                params = None
        res[attr] = {"params": params, "var_kw": var_kw}
    out[name] = {"names": res}
print(json.dumps(out))
"""


def list_spdl(python: str) -> dict[str, dict[str, list[str] | None]]:
    """SPDL's public names per module (run in SPDL's interpreter)."""
    proc = subprocess.run(
        [python, "-c", _LIST_SPDL, json.dumps(MODULES)], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        sys.exit(f"api_surface: cannot list SPDL 0.8.0's names with {python}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def probe_spdl_rs(python: str, spdl: dict[str, dict[str, list[str] | None]]) -> dict[str, dict]:
    """For each of SPDL's names, what spdl_rs has (run in spdl_rs's interpreter)."""
    wanted = {mod: sorted(names) for mod, names in spdl.items()}
    proc = subprocess.run(
        [python, "-c", _PROBE_SPDL_RS], input=json.dumps(wanted), capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        sys.exit(f"api_surface: cannot import spdl_rs with {python}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def readme_gaps(readme: Path) -> set[str]:
    """The fully qualified names (``spdl.io.X``) on the README's list of what is not carried over."""
    text = readme.read_text(encoding="utf-8")
    start = text.find(README_SECTION)
    if start < 0:
        return set()
    end = text.find("\n## ", start + len(README_SECTION))
    section = text[start : end if end >= 0 else len(text)]
    return set(re.findall(r"`(spdl(?:\.\w+)+)`", section))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spdl-python", default=str(ROOT / ".venv-peers/bin/python"))
    ap.add_argument("--spdl-rs-python", default=str(ROOT / ".venv/bin/python"))
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    ap.add_argument("--snapshot", type=Path, help="also write SPDL's names and parameters to this JSON file")
    args = ap.parse_args()

    spdl = list_spdl(args.spdl_python)
    if args.snapshot:
        args.snapshot.write_text(json.dumps({"spdl": "0.8.0", "modules": spdl}, indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.snapshot}")
    ours = probe_spdl_rs(args.spdl_rs_python, spdl)
    listed = readme_gaps(args.readme)

    total = present = 0
    unlisted: list[str] = []
    param_gaps: list[str] = []
    print(f"{'module':<24} {'SPDL':>5} {'spdl_rs':>8}  missing")
    for mod in MODULES:
        names = spdl[mod]
        info = ours.get(mod, {})
        have = info.get("names", {})
        missing = []
        for attr, params in sorted(names.items()):
            entry = have.get(attr)
            if entry is None or "missing" in entry:
                missing.append(attr)
                continue
            theirs = entry.get("params")
            internal = f"{mod}.{attr}" in INTERNAL_CONSTRUCTORS
            if params is not None and theirs is not None and not entry.get("var_kw") and not internal:
                lacking = [p for p in params if p not in theirs and not p.startswith("_")]
                if lacking:
                    param_gaps.append(f"{mod}.{attr}: spdl_rs takes no {', '.join(lacking)}")
        total += len(names)
        present += len(names) - len(missing)
        if "error" in info:
            print(f"{mod:<24} {len(names):>5} {'-':>8}  cannot import: {info['error']}")
        else:
            marked = [m if f"{mod}.{m}" in listed else f"{m} (NOT LISTED)" for m in missing]
            print(f"{mod:<24} {len(names):>5} {len(names) - len(missing):>8}  {', '.join(marked) or '-'}")
        unlisted += [f"{mod}.{m}" for m in missing if f"{mod}.{m}" not in listed]
    print(f"\n{present} of SPDL 0.8.0's {total} public names exist in spdl_rs ({100 * present / total:.1f}%).")
    if param_gaps:
        print(f"\nParameters SPDL takes that spdl_rs does not ({len(param_gaps)}):")
        for line in param_gaps:
            print(f"  {line}")
    stale = sorted(
        f"{mod}.{attr}"
        for mod in MODULES
        for attr in spdl[mod]
        if f"{mod}.{attr}" in listed and "missing" not in ours.get(mod, {}).get("names", {}).get(attr, {"missing": ""})
    )
    if stale:
        print(f"\nOn the README's list but present in spdl_rs (remove them from the list): {', '.join(stale)}")
    if unlisted:
        print(f"\nMissing and not on README.md's '{README_SECTION[3:]}' list: {', '.join(unlisted)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
