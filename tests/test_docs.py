"""The math pages under docs/: generated from the scripts' `# LaTeX:` comments, never drifting.

Checks: every formula parses with the KaTeX pinned in docs/assets/katex (under Node); the
committed pages equal what tools/render_math_docs.py produces now; every required equation is
annotated; an annotation whose code is gone is an error; both page forms hold the source
faithfully; each script's docstring names its pages; the mkdocs site builds with --strict and
loads nothing from the network.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "annotated_example.py"
REGENERATE = "python tools/render_math_docs.py"

_spec = importlib.util.spec_from_file_location("render_math_docs", REPO / "tools" / "render_math_docs.py")
rmd = importlib.util.module_from_spec(_spec)
sys.modules["render_math_docs"] = rmd
_spec.loader.exec_module(rmd)

SCRIPTS = list(rmd.SCRIPTS)


def _script(name: str):
    path = REPO / name
    assert path.exists(), f"{name} is missing: every algorithm script must exist and be rendered into docs/"
    return rmd.load_script(path)


def _fixture(text: str | None = None):
    return rmd.parse_script(FIXTURE.read_text() if text is None else text, FIXTURE.name)


def _fences(page: str):
    """(kind, first line or None, body lines) of every fenced block of a generated page, in order."""
    out = []
    for m in re.finditer(r'^(`{3,})(python linenums="(\d+)"|math)\n(.*?)\n\1$', page, re.S | re.M):
        kind = "math" if m.group(2) == "math" else "python"
        out.append((kind, int(m.group(3)) if m.group(3) else None, m.group(4).split("\n")))
    return out


# ---------------------------------------------------------------- (b) pages never drift


@pytest.fixture(scope="module")
def generated():
    return rmd.generate(REPO)


@pytest.mark.parametrize("name", SCRIPTS)
def test_committed_pages_equal_the_generator_output(name, generated):
    _script(name)
    stem = Path(name).stem
    for rel in (f"{stem}.md", f"{stem}_annotations.md"):
        path = REPO / "docs" / rel
        assert path.exists(), f"docs/{rel} is missing; run `{REGENERATE}`"
        assert path.read_text(encoding="utf-8") == generated[rel], f"docs/{rel} is out of date; run `{REGENERATE}`"


def test_index_links_both_forms_and_no_stale_pages(generated):
    index = (REPO / "docs" / "index.md").read_text(encoding="utf-8")
    assert index == generated["index.md"], f"docs/index.md is out of date; run `{REGENERATE}`"
    for name in SCRIPTS:
        stem = Path(name).stem
        assert f"]({stem}.md)" in index and f"]({stem}_annotations.md)" in index
    assert rmd.stale_pages(REPO / "docs", generated) == [], f"stale generated pages; run `{REGENERATE}`"


def test_generator_is_deterministic():
    s = _fixture()
    assert rmd.render_inline_page(s) == rmd.render_inline_page(_fixture())
    assert rmd.render_annotations_page(s) == rmd.render_annotations_page(_fixture())


@pytest.mark.parametrize("name", SCRIPTS)
def test_docstring_names_its_pages(name):
    stem = Path(name).stem
    doc = ast.get_docstring(ast.parse((REPO / name).read_text())) or ""
    for page in (f"docs/{stem}.md", f"docs/{stem}_annotations.md"):
        assert page in doc, f"the module docstring of {name} must name its page {page}"


# ---------------------------------------------------------------- (c) required equations


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_required_equation_is_annotated(name):
    missing = rmd.missing_equations(_script(name))
    assert not missing, (
        f"{name} has no `# LaTeX:` annotation for: {missing}. Annotate the code that computes each "
        "(REQUIRED in tools/render_math_docs.py lists what the formula or the code below it must match)"
    )


def test_a_deleted_required_annotation_is_reported():
    text = FIXTURE.read_text()
    base = set(rmd.missing_equations(_fixture(), rmd.PPO_REQUIRED))
    assert "kl (KL estimator)" not in base and "kl_2 (KL estimator)" not in base

    def without(*starts: str):
        lines = [ln for ln in text.splitlines() if not ln.strip().startswith(starts)]
        return set(rmd.missing_equations(_fixture("\n".join(lines) + "\n"), rmd.PPO_REQUIRED))

    # Two KL estimators are required: the one left cannot count twice.
    assert without(r"# LaTeX: \widehat{\mathrm{KL}}_3") - base == {"kl_2 (KL estimator)"}
    assert without(r"# LaTeX: \hat{A}_t") - base == {"gae (GAE advantage)"}
    assert without(r"# LaTeX: L^{\mathrm{CLIP}}") - base == {"surrogate (Clipped surrogate objective)"}
    # Entropy is annotated twice in the fixture: deleting one keeps it, deleting both does not.
    assert without(r"# LaTeX: \mathcal{H}[") == base
    assert without(r"# LaTeX: \mathcal{H}") - base == {"entropy (Entropy of the policy)"}


# ---------------------------------------------------------------- (d) orphaned annotations


def _replace_line(text: str, startswith: str, new: list[str]) -> str:
    lines = text.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.strip().startswith(startswith))
    return "\n".join(lines[:i] + new + lines[i + 1 :]) + "\n"


def _line_of(text: str, startswith: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if ln.strip().startswith(startswith))


@pytest.mark.parametrize(
    "code_line, replacement, expected",
    [
        ("lrnow = (1.0", [""], "is blank"),  # the code deleted, a blank line left
        ("lrnow = (1.0", ["    # compute the rate below"], "is a comment"),
        ("total += 0.5", [], "different indentation"),  # the block's last line deleted: a dedent follows
        ('"approx_kl": ((ratio', [], "different indentation"),  # inside brackets: the closing brace follows
    ],
)
def test_annotation_whose_code_is_gone_is_an_error(code_line, replacement, expected):
    text = FIXTURE.read_text()
    annotation_line = _line_of(text, code_line) - 1
    broken = _replace_line(text, code_line, replacement)
    with pytest.raises(rmd.AnnotationError) as err:
        _fixture(broken)
    assert f"{FIXTURE.name}:{annotation_line}:" in str(err.value) and expected in str(err.value)


def test_annotation_at_end_of_file_and_malformed_ones_are_errors():
    text = FIXTURE.read_text()
    n = len(text.splitlines())
    with pytest.raises(rmd.AnnotationError, match=rf"{FIXTURE.name}:{n + 1}: .*the file ends"):
        _fixture(text + "# LaTeX: x = 1\n")
    with pytest.raises(rmd.AnnotationError, match="malformed annotation"):
        _fixture(text.replace("# LaTeX: f = 1", "#LaTeX: f = 1"))
    with pytest.raises(rmd.AnnotationError, match="malformed annotation"):
        _fixture(text.replace("# LaTeX: f = 1", "# latex: f = 1"))
    with pytest.raises(rmd.AnnotationError, match="empty"):
        _fixture(text.replace("# LaTeX: f = 1 - \\frac{\\mathrm{step}}{\\mathrm{total}}", "# LaTeX:"))


def test_look_alikes_in_strings_are_not_annotations():
    s = _fixture()
    text = FIXTURE.read_text().splitlines()
    assert len(s.annotations) == sum(ln.lstrip().startswith("# LaTeX: ") for ln in text) == 9
    assert all(text[a.line - 1].lstrip().startswith("# LaTeX: ") for a in s.annotations)


# ---------------------------------------------------------------- the two forms hold the source


def _check_inline_page(s) -> None:
    """Form (a): code fences at their true line numbers + a math fence in place of each annotation."""
    by_line = {a.line: a for a in s.annotations}
    rebuilt: dict[int, str] = {}
    formulas, nxt = [], 1
    for kind, first, body in _fences(rmd.render_inline_page(s)):
        if kind == "math":
            assert len(body) == 1
            assert nxt in by_line and by_line[nxt].formula == body[0], f"{s.name}:{nxt}: math block out of place"
            formulas.append(body[0])
            nxt += 1
        else:
            assert first == nxt, f"{s.name}: code block starts at {first}, expected {nxt}"
            for i, line in enumerate(body):
                rebuilt[first + i] = line
            nxt = first + len(body)
    assert nxt == len(s.lines) + 1
    assert formulas == [a.formula for a in s.annotations]
    assert rebuilt == {i: ln for i, ln in enumerate(s.lines, 1) if i not in by_line}


def _check_annotations_page(s) -> None:
    """Form (b): per annotation, its formula then the source lines (true numbers) down to its code."""
    fences = _fences(rmd.render_annotations_page(s))
    assert len(fences) == 2 * len(s.annotations)
    for a, (math, code) in zip(s.annotations, zip(fences[::2], fences[1::2], strict=True), strict=True):
        assert math[0] == "math" and math[2] == [a.formula]
        kind, first, body = code
        assert kind == "python" and body == list(s.lines[first - 1 : first - 1 + len(body)])
        assert first <= a.line < a.code_start <= first + len(body) - 1 == a.code_end


def test_both_forms_on_the_fixture():
    s = _fixture()
    _check_inline_page(s)
    _check_annotations_page(s)
    page = rmd.render_annotations_page(s)
    # The annotated statement is shown whole: a multi-line call, a decorated function.
    assert '```python linenums="39"\n    # The paper calls clip_coef epsilon.\n' in page
    assert "-advantages * min(max(ratio, 1 - clip_coef), 1 + clip_coef),\n    )\n```" in page
    assert "@staticmethod\ndef discounted_advantages" in page and "    return advantages\n```" in page
    # A code line containing a backtick fence is still fenced correctly.
    assert '````python linenums="1"' in rmd.render_inline_page(s)


@pytest.mark.parametrize("name", SCRIPTS)
def test_both_forms_on_the_scripts(name):
    s = _script(name)
    assert s.annotations, f"{name} has no `# LaTeX:` annotation"
    _check_inline_page(s)
    _check_annotations_page(s)


def test_notation_table_cannot_drift(monkeypatch):
    s = _script(SCRIPTS[0])
    rmd._check_notation(s)
    monkeypatch.setitem(rmd.NOTATION, s.name, [("x", r"\nosuchsymbol", "no_such_name_anywhere", "gone")])
    with pytest.raises(rmd.AnnotationError, match="no_such_name_anywhere.*nosuchsymbol"):
        rmd._check_notation(s)


# ---------------------------------------------------------------- (a) every formula renders


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("node is required in CI to check the formulas with KaTeX (apt-get install nodejs)")
        pytest.skip("node not installed: cannot check formulas with KaTeX")
    return node


def _katex_failures(items: list[dict]) -> list[dict]:
    proc = subprocess.run(
        [_node(), str(REPO / "tools" / "katex_check.js")],
        input=json.dumps(items),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def test_every_formula_parses_with_katex():
    items = []
    for s in [_script(n) for n in SCRIPTS] + [_fixture()]:
        items += [{"where": f"{s.name}:{a.line}", "tex": a.formula} for a in s.annotations]
    for sym, here, _, _meaning in (row for rows in rmd.NOTATION.values() for row in rows):
        items += [{"where": "NOTATION", "tex": sym}, {"where": "NOTATION", "tex": here}]
    failures = _katex_failures(items)
    assert not failures, "formulas KaTeX rejects:\n" + "\n".join(f"{f['where']}: {f['error']}" for f in failures)


def test_katex_check_rejects_broken_formulas():
    bad = [{"where": "a", "tex": r"\frac{a}{"}, {"where": "b", "tex": r"\undefinedmacro{x}"}, {"where": "c", "tex": "x^"}]
    assert [f["where"] for f in _katex_failures(bad + [{"where": "ok", "tex": r"\hat{A}_t"}])] == ["a", "b", "c"]


# ---------------------------------------------------------------- the static site


def test_mkdocs_site_builds_strict_and_offline(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = (site / f"{Path(SCRIPTS[0]).stem}.html").read_text(encoding="utf-8")
    assert page.count('class="arithmatex"') >= len(_script(SCRIPTS[0]).annotations)
    assert "assets/katex/katex.min.js" in page and "assets/js/render-math.js" in page
    assert (site / "assets" / "katex" / "fonts" / "KaTeX_Main-Regular.woff2").exists()
    for html in site.glob("*.html"):
        external = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(?:https?:)?//[^"]+"', html.read_text(encoding="utf-8"))
        assert not external, f"{html.name} loads from the network: {external}"
