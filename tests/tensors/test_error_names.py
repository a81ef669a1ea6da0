"""The error names live once, in b12x.errors.__all__: the package re-exports
that list, and every class the extension maps Rust errors to is on it (an
unknown name would only fail, as a panic, when that error is first raised)."""

from __future__ import annotations

import re
from pathlib import Path

import b12x
from b12x import errors

ERROR_RS = Path(__file__).resolve().parents[2] / "rust" / "python" / "src" / "error.rs"


def test_every_listed_name_is_a_b12x_error_and_reexported():
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.B12xError), name
        assert getattr(b12x, name) is cls, name
    assert set(errors.__all__) <= set(b12x.__all__)


def test_no_b12x_error_class_is_left_off_the_list():
    classes = {n for n, v in vars(errors).items() if isinstance(v, type)}
    assert classes == set(errors.__all__)


def test_the_extension_imports_only_listed_classes():
    imported = re.findall(r"import_exception!\(b12x\.errors, (\w+)\)", ERROR_RS.read_text())
    assert imported, f"no import_exception! found in {ERROR_RS}"
    assert set(imported) <= set(errors.__all__)


def test_errors_are_mapped_to_classes_in_one_place():
    """Only error.rs picks exception classes; the other binding files return
    b12x-core errors (KeyError stays for the mapping protocol of layouts)."""
    src = ERROR_RS.parent
    for path in src.rglob("*.rs"):
        if path == ERROR_RS:
            continue
        text = path.read_text()
        assert "import_exception!" not in text, path
        for found in re.findall(r"(\w+)::new_err", text):
            assert found in {"PyKeyError", "PyImportError"}, (path, found)
