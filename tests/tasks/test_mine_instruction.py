"""Instructions written from names, docstrings and paths: terse, and naming what to do."""

from __future__ import annotations

from opencomposer.tasks.instruction import bug_instruction, feature_instruction, first_sentence


def test_first_sentence_is_plain_text():
    assert first_sentence("Return the :func:`sum` of ``xs``.\n\nMore text.") == "Return the `sum` of `xs`."
    assert first_sentence("group items\n    by key") == "Group items by key."
    assert first_sentence(">>> f(1)\n2") == ""
    long = first_sentence("word " * 100)
    assert len(long) <= 164 and long.endswith("...")


def test_feature_instruction_names_functions_files_and_a_docstring():
    text = feature_instruction([
        ("pkg/util.py", "fmt_ts", "Format a timestamp as ISO 8601.\n\nDetails."),
        ("pkg/cli.py", "parse_range", "Parse 'a-b' into a range."),
    ])
    assert text == ("Implement `fmt_ts` in pkg/util.py; and `parse_range` in pkg/cli.py: Format a timestamp "
                    "as ISO 8601. Parse 'a-b' into a range. Keep the existing API.")


def test_feature_instruction_stays_under_the_limit_for_many_functions():
    funcs = [(f"pkg/mod{i % 3}.py", f"Class{i}.method_with_a_long_name_{i}", f"Does thing number {i} well.")
             for i in range(40)]
    text = feature_instruction(funcs)
    assert len(text) <= 400
    assert all(f"pkg/mod{i}.py" in text for i in range(3))  # every file is named
    assert "more" in text and text.endswith("Keep the existing API.")
    short = feature_instruction(funcs, limit=200)
    assert short.startswith("Implement the 40 functions that raise NotImplementedError in pkg/mod0.py") and len(short) <= 200


def test_bug_instruction():
    text = bug_instruction("pkg/a.py", "Box.area", "Width times height.", "flip_arith")
    assert text == "Fix the bug in `Box.area` (pkg/a.py): it computes a wrong value. Its docstring says: Width times height."
    assert bug_instruction("pkg/a.py", "f", "", "remove_loop") == "Fix the bug in `f` (pkg/a.py): part of the work is skipped."
