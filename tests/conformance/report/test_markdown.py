"""flint_moe.conformance.report.markdown: ``md`` renders any text as exactly that text, making no markup."""

from __future__ import annotations

from flint_moe.conformance.report import markdown


def test_md_escapes_every_markup_character_and_line_breaks():
    assert markdown.md("a|b`c*d_e[f]g<h>i#j\\k~l\nm\r\nn\ro") == r"a\|b\`c\*d\_e\[f\]g\<h\>i\#j\\k\~l m n o"
    assert markdown.md(3) == "3" and markdown.md(None) == "None"
    assert markdown.md("nvfp4_decode/x/M1", code=True) == "`nvfp4_decode/x/M1`"  # inside a code span nothing is markup
    for text, want in (("a|b", r"a\|b"), ("a`b", r"a\`b"), ("a\\b_", r"a\\b\_"), ("a\nb*", r"a b\*"), ("", "")):
        assert markdown.md(text, code=True) == want  # what a code span cannot hold safely is escaped instead
