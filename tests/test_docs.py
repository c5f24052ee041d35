"""The examples in the docstrings and the README run and say what they claim."""

from __future__ import annotations

import doctest
import pathlib
import re

import speckv
import speckv._api


def test_docstring_examples():
    for module in (speckv, speckv._api):
        failed, attempted = doctest.testmod(module)
        assert attempted > 0 and failed == 0


def test_readme_usage_example():
    readme = pathlib.Path(__file__).resolve().parents[1] / "README.md"
    block = re.search(r"## Use\n\n```python\n(.*?)```", readme.read_text(), re.S).group(1)
    exec(compile(block, "README.md", "exec"), {})
