"""Tasks: the task format (task.py), task images (build.py), the grader with hidden tests and
its reward-hack defences (grade.py), suite validation (validate.py), SWE-bench-style export
(export.py) and the generated smoke suite (smoke.py). Nothing is imported here, so that the
`opencomposer` CLI starts fast; import the modules you need.
"""
