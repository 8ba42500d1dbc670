from unittest import TestCase

from mistune import BlockState, HTMLRenderer, create_markdown
from mistune.renderers.markdown import MarkdownRenderer
from mistune.renderers.rst import RSTRenderer
from tests import BaseTestCase


def load_renderer(renderer):
    class TestRenderer(BaseTestCase):
        parse = create_markdown(renderer=renderer)

    name = renderer.NAME
    TestRenderer.load_fixtures("renderer_" + name + ".txt")
    globals()["TestRenderer" + name.title()] = TestRenderer


load_renderer(RSTRenderer())
load_renderer(MarkdownRenderer())


class TestRSTRendererLineBreaks(TestCase):
    def test_tight_list_hard_breaks(self):
        render = create_markdown(renderer=RSTRenderer())
        for text, expected in (
            ("- first  \n  second\n", "- | first\n  | second\n"),
            ("1. first\\\n   second\n", "1. | first\n   | second\n"),
        ):
            with self.subTest(text=text):
                self.assertEqual(render(text), expected)


class TestMarkdownRendererRoundTrip(TestCase):
    """Reformatting valid Markdown must not change its meaning: rendering the
    reformatted source to HTML must match rendering the original source."""

    to_html = create_markdown(escape=False)
    reformat = create_markdown(renderer=MarkdownRenderer())

    def assert_round_trip(self, text):
        self.assertEqual(
            self.to_html(self.reformat(text)),
            self.to_html(text),
        )

    def test_escaped_block_markers(self):
        # an escaped leading marker is literal text, not a new block
        for marker in (r"\*", r"\-", r"\+", r"\#", r"\##", r"\>", r"1\.", r"3\)"):
            self.assert_round_trip(marker + " literal\n")

    def test_escaped_marker_on_continuation_line(self):
        self.assert_round_trip("paragraph\n\\* not a list\n")

    def test_escaped_marker_inside_list_item(self):
        self.assert_round_trip("- item\n\n  \\# not a heading\n")

    def test_escaped_backtick(self):
        self.assert_round_trip(r"\`not code\`" + "\n")

    def test_literal_inline_markers(self):
        for text in (
            r"\![label](https://example.com)" + "\n",
            r"\\*emphasis*" + "\n",
            r"\<b>text\</b>" + "\n",
            r"\<https://example.com>" + "\n",
            r"\&copy;" + "\n",
            r"\&#65;" + "\n",
            r"\&#x41;" + "\n",
        ):
            with self.subTest(text=text):
                self.assert_round_trip(text)

    def test_inline_punctuation_and_real_markup_controls(self):
        for text in (
            "Tom & Jerry!\n",
            "Entities: &copy; &#65; &#x41; &notanentity;\n",
            "C# and a.b.c, (parentheses), [unmatched brackets]\n",
            "*emphasis* and `code &copy;`\n",
            "![image](https://example.com/image.png)\n",
            "<b>real HTML</b>\n",
            "<https://example.com/?a=1&b=2>\n",
        ):
            with self.subTest(text=text):
                self.assert_round_trip(text)

    def test_escaped_emphasis_markers(self):
        # an escaped "*"/"_" is a literal delimiter, not emphasis; re-emitting
        # it unescaped would turn plain text back into <em>/<strong>
        for text in (
            r"\*not emphasis\*" + "\n",
            r"\_not emphasis\_" + "\n",
            r"\*\*not strong\*\*" + "\n",
            r"\_\_not strong\_\_" + "\n",
            r"a word\_with\_underscores" + "\n",
            r"2 \* 3 \* 4" + "\n",
            r"trailing star\*" + "\n",
            r"\*leading star" + "\n",
        ):
            self.assert_round_trip(text)

    def test_real_emphasis_not_over_escaped(self):
        # genuine emphasis must survive untouched, and prose punctuation with
        # spaces around a "*"/"_" must not gain stray backslashes
        for text in (
            "*emphasis*\n",
            "**strong**\n",
            "***both***\n",
            "_under_ and __strong__\n",
            "a *b* and _c_ mixed\n",
            "2 * 3 = 6 and 4 * 5\n",
            "snake_case_variable\n",
        ):
            self.assert_round_trip(text)

    def test_codespan_containing_backticks(self):
        # the delimiter must grow past any backtick run inside the code span,
        # and pad away a leading/trailing backtick, or the re-parse breaks
        for text in (
            "``a single ` backtick``\n",
            "``` two `` backticks ```\n",
            "`` `leading backtick``\n",
            "``trailing backtick` ``\n",
            "`` `surrounded` ``\n",
        ):
            self.assert_round_trip(text)

    def test_codespan_edge_spaces(self):
        for text in (
            "`  x  `",
            "`   x   `",
            "`  x `",
            "` x  `",
            "` `",
            "`   `",
            "``  a ` b  ``",
        ):
            with self.subTest(text=text):
                self.assert_round_trip(text)

    def test_image_alt_matching_url_stays_an_image(self):
        for text in (
            "![https://example.com](https://example.com)",
            "![user@example.com](mailto:user@example.com)",
            "[![https://example.com](https://example.com)](/target)",
        ):
            with self.subTest(text=text):
                self.assert_round_trip(text)

    def test_link_autolinks_still_render(self):
        self.assertEqual(
            self.reformat("[https://example.com](https://example.com)"),
            "<https://example.com>\n",
        )
        self.assertEqual(
            self.reformat("[user@example.com](mailto:user@example.com)"),
            "<user@example.com>\n",
        )

    def test_indented_code_containing_fences(self):
        parse = create_markdown(renderer="ast")
        for indentation in range(4):
            for markers in (("```",), ("~~~",), ("```", "~~~"), ("````", "~~~")):
                with self.subTest(indentation=indentation, markers=markers):
                    lines = ["before"] + [" " * indentation + marker for marker in markers] + ["after"]
                    source = "".join("    " + line + "\n" for line in lines)
                    tokens = parse(self.reformat(source))
                    self.assertEqual([token["type"] for token in tokens], ["block_code"])
                    self.assertEqual(tokens[0]["raw"], "\n".join(lines) + "\n")

    def test_link_title_containing_quote(self):
        # a double quote inside a link/image title must be escaped, or the
        # re-parse closes the title early and drops it
        for text in (
            "[t](/u 'say \"hi\"')\n",
            '[t](/u "say \\"hi\\"")\n',
            "![a](/u 'say \"hi\"')\n",
            "[t][r]\n\n[r]: /u 'say \"hi\"'\n",
            '[t](/u "back\\\\slash \\" quote")\n',
        ):
            self.assert_round_trip(text)

    def test_empty_reference_link_destination(self):
        for reference in ("[text][r]", "[r][]", "[r]"):
            for title in ("", ' "title"', " 'say \"hi\"'"):
                with self.subTest(reference=reference, title=title):
                    text = reference + "\n\n[r]: <>" + title + "\n"
                    self.assertIn('href=""', self.to_html(text))
                    self.assert_round_trip(text)

    def test_empty_reference_image_destination(self):
        for title in ("", ' "title"', " 'say \"hi\"'"):
            with self.subTest(title=title):
                text = "![alt][r]\n\n[r]: <>" + title + "\n"
                self.assertIn('src=""', self.to_html(text))
                self.assert_round_trip(text)

    def test_unused_empty_reference_destination(self):
        self.assertEqual(self.reformat("[r]: <>\n"), "[r]: <>\n")
        self.assertEqual(self.reformat('[r]: <> "title"\n'), '[r]: <> "title"\n')

    def test_nonempty_reference_destination_format(self):
        for destination in ("/url", "https://example.com", "/path(a)"):
            with self.subTest(destination=destination):
                text = '[text][r]\n\n[r]: ' + destination + ' "title"\n'
                self.assertEqual(self.reformat(text), text)

    def test_block_quote_content_ending_in_gt(self):
        # a block quote whose content ends with ">" (an autolink, an inline
        # HTML tag, or a literal ">") must keep that character; it was being
        # stripped along with the trailing quote marker
        for text in (
            "> <https://example.com>\n",
            "> <b>raw</b>\n",
            "> ends with a literal &gt; >\n",
            "> > nested <https://example.com>\n",
            "> first\n>\n> <https://example.com>\n",
        ):
            self.assert_round_trip(text)

    def test_multiline_setext_heading(self):
        # a setext heading may span several lines; re-emitting it as an ATX
        # heading ("# ...") drops every line after the first out of the
        # heading, because an ATX heading is a single line
        for text in (
            "Foo\nBar\n===\n",
            "Foo\nBar\n---\n",
            "one\ntwo\nthree\n===\n",
            "Foo *bar\nbaz*\n====\n",
        ):
            self.assert_round_trip(text)

    def test_real_markers_preserved(self):
        for text in (
            "* bullet\n",
            "# heading\n",
            "1. ordered\n",
            "> quote\n",
            "`code`\n",
            "*emphasis*\n",
        ):
            self.assert_round_trip(text)

    def test_heading_literal_trailing_hashes(self):
        for text in (
            "foo #\n---\n",
            "foo ###\n===\n",
            "# foo \\#\n",
            "###### \\###\n",
            "foo\t###\n---\n",
            "foo#\n---\n",
            "# C#\n",
            "# `foo #`\n",
        ):
            with self.subTest(text=text):
                self.assert_round_trip(text)

    def test_prose_not_over_escaped(self):
        for text in (
            "snake_case_var\n",
            "use - dashes - here\n",
            "C# and a.b.c and 1.5\n",
            "ratio a/b is fine\n",
        ):
            self.assert_round_trip(text)

    def test_leading_blank_lines_preserved(self):
        # blank_line tokens at the start of the document were rendered as
        # empty strings, so leading newlines disappeared on reformat
        self.assertEqual(self.reformat("\nabc"), "\nabc\n")
        self.assertEqual(self.reformat("\n\n\n\nabc"), "\n\n\n\nabc\n")


class TestRendererListLineEndings(TestCase):
    non_line_breaks = ("\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")

    def test_markdown_list_content(self):
        reformat = create_markdown(renderer=MarkdownRenderer())
        to_html = create_markdown(escape=False)
        for separator in self.non_line_breaks:
            content = "before" + separator + "after"
            for template in (
                "- {}\n",
                "1. {}\n",
                "- parent\n  - {}\n",
                "- first\n\n- {}\n",
                "- `{}`\n",
                "- item\n\n  ```\n  {}\n  ```\n",
            ):
                with self.subTest(separator=repr(separator), template=template):
                    source = template.format(content)
                    result = reformat(source)
                    self.assertIn(content, result)
                    self.assertEqual(to_html(result), to_html(source))

    def test_rst_list_content(self):
        render = create_markdown(renderer=RSTRenderer())
        for separator in self.non_line_breaks:
            content = "before" + separator + "after"
            for source, expected in (
                ("- " + content + "\n", "- " + content + "\n"),
                ("1. " + content + "\n", "1. " + content + "\n"),
                ("- `" + content + "`\n", "- ``" + content + "``\n"),
            ):
                with self.subTest(separator=repr(separator), source=source):
                    self.assertEqual(render(source), expected)

    def test_markdown_list_line_endings(self):
        reformat = create_markdown(renderer=MarkdownRenderer())
        expected = "- first\n  continued\n- second\n"
        for ending in ("\n", "\r", "\r\n"):
            with self.subTest(ending=repr(ending)):
                self.assertEqual(reformat(expected.replace("\n", ending)), expected)


class TestRendererMethodRegistration(TestCase):
    def test_registered_renderer_method(self):
        renderer = HTMLRenderer(escape=False)

        def render_wiki(renderer, key, title):
            return f'<a href="/wiki/{key}">{title}</a>'

        renderer.register("wiki", render_wiki)
        token = {"type": "wiki", "raw": "python", "attrs": {"title": "Python"}}

        self.assertEqual(
            renderer.render_token(token, BlockState()),
            '<a href="/wiki/python">Python</a>',
        )

    def test_html_safety_helpers(self):
        renderer = HTMLRenderer(escape=False)

        self.assertFalse(renderer.escape_enabled)
        self.assertEqual(renderer.escape_raw("<b>raw</b>"), "<b>raw</b>")
        self.assertEqual(renderer.escape_attribute('a"<b>'), "a&quot;&lt;b&gt;")
        self.assertEqual(
            renderer.render_attrs({"class": 'a"b', "hidden": True, "empty": False, "missing": None}),
            ' class="a&quot;b" hidden',
        )
        self.assertEqual(renderer.sanitize_url("javascript:marker"), "#harmful-link")
        self.assertEqual(renderer.safe_url('https://example.com/?q="x"'), "https://example.com/?q=&quot;x&quot;")

        renderer.escape_enabled = True
        self.assertEqual(renderer.escape_raw("<b>raw</b>"), "&lt;b&gt;raw&lt;/b&gt;")

        with self.assertRaises(ValueError):
            renderer.render_attrs({'class" onclick': "marker"})

    def test_escape_false_only_allows_raw_html(self):
        md = create_markdown(escape=False)
        html = md('<b>raw</b> [link](javascript:marker "a\\\"b")')

        self.assertIn("<b>raw</b>", html)
        self.assertIn('href="#harmful-link"', html)
        self.assertIn('title="a&quot;b"', html)


class TestMarkdownRendererPlugins(TestCase):
    def test_task_list_item_can_be_overridden(self):
        class MyRenderer(MarkdownRenderer):
            def task_list_item(self, token, state):
                return "TASK\n"

        md = create_markdown(renderer=MyRenderer(), plugins=["task_lists"])
        self.assertEqual(md("- [x] a task"), "TASK\n")

    def test_task_list_item_default_markdown(self):
        md = create_markdown(renderer=MarkdownRenderer(), plugins=["task_lists"])
        self.assertEqual(md("- [x] a task"), "- [x] a task\n")

    def test_table_markdown(self):
        md = create_markdown(renderer=MarkdownRenderer(), plugins=["table"])
        result = md("| A | B |\n|---|---|\n| 1 | 2 |\n")
        self.assertEqual(result, "| A | B |\n| --- | --- |\n| 1 | 2 |\n")

    def test_table_codespan_escaped_pipes_round_trip(self):
        md = create_markdown(renderer=MarkdownRenderer(), plugins=["table"])
        to_html = create_markdown(plugins=["table"])
        for cell in (r"`a\|b`", r"`a\\\|b`", r"`a\|b\|c`"):
            for source in (
                "| Header |\n| --- |\n| " + cell + " |\n",
                "| " + cell + " |\n| --- |\n| Body |\n",
            ):
                with self.subTest(source=source):
                    result = md(source)
                    self.assertEqual(result, source)
                    self.assertEqual(to_html(result), to_html(source))

    def test_table_plain_escaped_pipe_round_trip(self):
        md = create_markdown(renderer=MarkdownRenderer(), plugins=["table"])
        to_html = create_markdown(plugins=["table"])
        source = "| Header |\n| --- |\n| a \\| b |\n"
        self.assertEqual(md(source), source)
        self.assertEqual(to_html(md(source)), to_html(source))

    def test_formatting_plugins_markdown(self):
        md = create_markdown(renderer=MarkdownRenderer(), plugins=["strikethrough", "mark", "insert"])
        self.assertEqual(md("~~gone~~, ==marked== and ^^inserted^^\n"), "~~gone~~, ==marked== and ^^inserted^^\n")
        self.assertEqual(md("~~a **b** c~~\n"), "~~a **b** c~~\n")

    def test_standalone_list_item(self):
        renderer = MarkdownRenderer()
        token = {
            "type": "list_item",
            "children": [
                {
                    "type": "paragraph",
                    "children": [{"type": "text", "raw": "x"}],
                }
            ],
        }
        self.assertEqual(renderer.render_token(token, BlockState()), "- x\n\n")
