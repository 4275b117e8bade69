"""README.md and docs/usage.md: the README stays short (what the project is, the two commands, the steps for a
kernel change), keeps the test command CI runs, holds no tracker words, links only to files that exist; usage.md
names every directory the source digest covers."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
USAGE = (ROOT / "docs" / "usage.md").read_text()


def test_readme_is_short():
    lines = README.splitlines()
    assert len(lines) <= 60 and len(README.split()) <= 700
    assert max(len(ln) for ln in lines) <= 120


def test_readme_opens_with_three_sentences_then_the_commands():
    intro = README.split("\n## ")[0].split("\n", 1)[1].strip()
    assert len(re.findall(r"[.!?](?:\s|$)", intro)) == 3
    sections = re.findall(r"^## (.+)$", README, flags=re.M)
    assert sections[:2] == ["The two commands", "For a kernel change, do this"]
    commands = README.split("## The two commands")[1].split("\n## ")[0]
    # .ci/run calls exactly this test command
    assert "nox -s conformance" in commands and "nox -s tests" in commands
    assert "nox -s tests" in (ROOT / ".ci" / "run").read_text()


def test_no_tracker_words():
    for name, text in (("README.md", README), ("docs/usage.md", USAGE)):
        for word in (r"\bissue #?\d+", r"#\d+\b", r"\bowner\b", r"\bround \d+\b", r"\bsession\b", r"\bhelper\b"):
            assert not re.search(word, text, flags=re.I), (name, word)


def test_relative_links_exist():
    for base, text in ((ROOT, README), (ROOT / "docs", USAGE)):
        for target in re.findall(r"\]\(([^)#]+)\)", text):
            if "://" not in target:
                assert (base / target).exists(), target


def test_usage_names_every_digested_directory():
    from flint_moe.conformance.report.digest import DIGEST_DIRS

    section = USAGE.split("## GPU evidence and the freshness line")[1].split("\n## ")[0]
    for d in DIGEST_DIRS:
        assert f"`{d}`" in section, d


def test_usage_lists_every_conformance_option(capsys):
    """Every option of ``python -m flint_moe.conformance --help`` has its row in usage.md's options table."""
    import pytest

    from flint_moe.conformance import __main__ as cli

    with pytest.raises(SystemExit):
        cli.main(["--help"])
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", capsys.readouterr().out)) - {"--help"}
    assert {"--shape", "--route", "--checkpoint", "--list", "--force"} <= options
    table = USAGE.split("## Conformance CLI options")[1].split("\n## ")[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("| `--")]
    for opt in sorted(options):
        assert any(re.search(rf"(?<![\w-]){opt}(?![\w-])", ln.split(" | ")[0]) for ln in rows), opt
