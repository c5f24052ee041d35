"""The repository's own lints (``.ci/``) on small packages made for the test: each refuses
what it exists to refuse and passes the package itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lint(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / ".ci" / name), *args], capture_output=True, text=True)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


OWNER = {
    "__init__.py": "",
    "_core.py": "def _floor_helper():\n    pass\n",
    "a/__init__.py": "",
    "a/x.py": (
        "def _secret():\n    pass\n\n"
        "class Codec:\n    def __init__(self):\n        self._hidden = 1\n\n    def _encode(self):\n        pass\n"
    ),
    "a/y.py": "from .x import _secret\n\ndef same_package(codec):\n    return codec._encode(), _secret()\n",
}


def test_private_names_refuses_a_private_name_from_another_package(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            **OWNER,
            "b/__init__.py": "",
            "b/z.py": (
                "from ..a.x import _secret\n\ndef other_package(codec):\n    return codec._hidden + codec._encode()\n"
            ),
        },
    )
    got = _lint("private-names", str(root))
    assert got.returncode == 1, got.stdout
    lines = got.stdout.splitlines()
    assert "pkg/b/z.py:1: imports pkg.a.x._secret, private to pkg.a" in lines
    assert "pkg/b/z.py:4: uses codec._hidden, private to pkg.a" in lines
    assert "pkg/b/z.py:4: uses codec._encode, private to pkg.a" in lines
    assert len(lines) == 3  # a/y.py uses its own package's names


def test_private_names_lets_a_package_use_its_own_and_the_roots_private_modules(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            **OWNER,
            "b/__init__.py": "",
            # the root's private module is the distribution's floor; a third-party object's
            # private attribute (defined nowhere here) is not the lint's
            "b/z.py": "from .. import _core\n\ndef ok(config):\n    return _core, config._attn_implementation\n",
        },
    )
    got = _lint("private-names", str(root))
    assert got.returncode == 0, got.stdout


def test_private_names_passes_speckv() -> None:
    got = _lint("private-names")
    assert got.returncode == 0, got.stdout
