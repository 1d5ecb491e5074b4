"""SPDL 0.8.0's public API in spdl_rs: every name exists under the same path, or README.md lists it as not
carried over (with the reason and what to use instead), and the parameters SPDL's callables take are taken.

``spdl_080_api.json`` holds SPDL 0.8.0's public names per module and the parameters of its callables, written by
``benches/compare/api_surface.py --snapshot`` from SPDL installed from PyPI (SPDL itself is not in the test venv).
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
README = HERE.parents[2] / "README.md"
SECTION = "## Not carried over from SPDL"
#: Classes SPDL constructs itself: their constructor's parameters are not API users call.
INTERNAL_CONSTRUCTORS = {"spdl.pipeline.Pipeline"}


def _snapshot() -> dict[str, dict[str, list[str] | None]]:
    return json.loads((HERE / "spdl_080_api.json").read_text())["modules"]


def _not_carried_over() -> set[str]:
    text = README.read_text(encoding="utf-8")
    start = text.find(SECTION)
    assert start >= 0, f"README.md has no {SECTION!r} section"
    end = text.find("\n## ", start + len(SECTION))
    return set(re.findall(r"`(spdl(?:\.\w+)+)`", text[start : end if end >= 0 else len(text)]))


def _lookup(qualified: str) -> tuple[bool, Any]:
    mod_name, attr = qualified.rsplit(".", 1)
    try:
        mod = importlib.import_module("spdl_rs" + mod_name[len("spdl") :])
        return True, getattr(mod, attr)
    except (AttributeError, ImportError) as e:  # a lazily loaded name whose module fails to import is missing too
        return False, e


NAMES = sorted(f"{mod}.{attr}" for mod, attrs in _snapshot().items() for attr in attrs)


def test_snapshot_is_spdl_080() -> None:
    assert len(NAMES) >= 160
    assert "spdl.pipeline.PipelineBuilder" in NAMES and "spdl.io.load_image" in NAMES


@pytest.mark.parametrize("qualified", NAMES)
def test_name_exists_or_is_listed(qualified: str) -> None:
    found, obj = _lookup(qualified)
    listed = qualified in _not_carried_over()
    if listed:
        assert not found, f"{qualified} exists in spdl_rs: remove it from README.md's list"
    else:
        assert found, f"spdl_rs lacks {qualified} ({obj}), and README.md's {SECTION[3:]!r} list does not name it"


def test_at_least_90_percent_carried_over() -> None:
    present = sum(_lookup(q)[0] for q in NAMES)
    assert present / len(NAMES) >= 0.9, f"{present} of {len(NAMES)} names"


def test_every_listed_gap_is_a_spdl_name() -> None:
    unknown = _not_carried_over() - set(NAMES)
    assert not unknown, f"README.md lists names SPDL 0.8.0 does not have: {sorted(unknown)}"


CALLABLES = sorted(
    (f"{mod}.{attr}", params)
    for mod, attrs in _snapshot().items()
    for attr, params in attrs.items()
    if params is not None and f"{mod}.{attr}" not in INTERNAL_CONSTRUCTORS
)


@pytest.mark.parametrize(("qualified", "params"), CALLABLES, ids=[q for q, _ in CALLABLES])
def test_parameters(qualified: str, params: list[str]) -> None:
    found, obj = _lookup(qualified)
    if not found:
        pytest.skip(f"{qualified} is not carried over")
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        pytest.skip(f"{qualified} has no introspectable signature")
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    ours = set(sig.parameters)
    lacking = [p for p in params if p not in ours and not p.startswith("_")]
    assert not lacking, f"{qualified} takes no {lacking} (SPDL's parameters: {params})"
