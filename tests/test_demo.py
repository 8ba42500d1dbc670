"""`make demo` (the harness demo) end to end: 8 forks, scripted tool calls, 8 distinct diffs."""

import io

from rich.console import Console

from opencomposer.demo import FEATURES, main


def test_demo_forks_edit_and_test_independently():
    out = io.StringIO()
    outcomes = main(Console(file=out, width=120))
    assert set(outcomes) == {f.name for f in FEATURES}
    for name, (passed, diff) in outcomes.items():
        assert passed, f"fork {name}'s test failed in the sandbox:\n{out.getvalue()}"
        assert f"+def {name}(obj, **kw):" in diff
        assert f"b/tests/test_{name}.py" in diff
        # each fork sees only its own change
        others = [f.name for f in FEATURES if f.name != name]
        assert not any(f"+def {o}(" in diff for o in others)
    assert "base image unchanged: True" in out.getvalue()
