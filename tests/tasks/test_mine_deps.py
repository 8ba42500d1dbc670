"""Declared requirements read from the metadata shapes real sdists ship (metadata.py).

Each tree copies the shape of a real project's files (named in the test), trimmed to what
the reader looks at. The sandbox's Python is 3.11, so `python_version < "3.11"` is false.
"""

from __future__ import annotations

import textwrap

import pytest
from tasks_util import wheel

from opencomposer.errors import TaskError
from opencomposer.tasks.deps import resolve
from opencomposer.tasks.metadata import Declared, declared_requirements, project_identity
from opencomposer.tasks.mine import BASE_REQUIREMENTS


def _tree(root, files: dict[str, str]):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text).lstrip())
    return root


def test_old_setuptools_sdist_setup_py_literals_egg_info_and_tox(tmp_path):
    # glom 25.12.0: PKG-INFO 2.1 without Requires-Dist; setup.py literals; tox deps = a pip-compile lock
    root = _tree(tmp_path, {
        "PKG-INFO": "Metadata-Version: 2.1\nName: glom\nVersion: 25.12.0\nProvides-Extra: toml\nProvides-Extra: yaml\n",
        "setup.py": """
            from setuptools import setup
            setup(name='glom', install_requires=['boltons>=19.3.0', 'attrs', 'face>=20.1.1'],
                  extras_require={'toml': ['tomli; python_version<"3.11"'], 'yaml': ['PyYAML']})
            """,
        "glom.egg-info/requires.txt": "boltons>=19.3.0\nattrs\nface>=20.1.1\n\n[toml]\n\n"
                                      '[toml:python_version < "3.11"]\ntomli\n\n[yaml]\nPyYAML\n',
        "tox.ini": "[tox]\nenvlist = py311\n\n[testenv]\ndeps = -rrequirements.txt\nextras = toml, yaml\n"
                   "commands = pytest\n",
        "requirements.txt": "attrs==24.2.0\n    # via -r requirements.in\ncoverage==7.2.7\nface==24.0.0\n"
                            "pytest==7.4.4\ntox==4.8.0\npyyaml==6.0.1\n",
    })
    d = declared_requirements(root, "glom")
    assert d.runtime == ["boltons>=19.3.0", "attrs", "face>=20.1.1"]
    # tox's extras come first; the lock's exact pins are loosened (pyyaml is PyYAML again);
    # pytest/coverage are the miner's; tox is a tool
    assert d.test == ["PyYAML", "face"]
    assert "tox.ini [testenv] deps" in d.origins


def test_pkg_info_extras_markers_and_self_reference(tmp_path):
    # a hatchling sdist (e.g. humanize, rich): Requires-Dist with extra markers; dev extra names pkg[test]
    root = _tree(tmp_path, {
        "PKG-INFO": """
            Metadata-Version: 2.4
            Name: demo-pkg
            Version: 1.0
            Requires-Dist: attrs>=22
            Requires-Dist: tomli>=1.1; python_version < "3.11"
            Requires-Dist: typing-extensions; python_version >= "3.8"
            Provides-Extra: test
            Requires-Dist: freezegun; extra == "test"
            Requires-Dist: pytest>=7; extra == "test"
            Requires-Dist: hypothesis; (python_version >= "3.9") and extra == "test"
            Provides-Extra: dev
            Requires-Dist: demo-pkg[test]; extra == "dev"
            Requires-Dist: mypy; extra == "dev"
            """,
        "pyproject.toml": '[project]\nname = "demo-pkg"\ndependencies = ["attrs>=22", "ignored-when-pkg-info-has-them"]\n',
    })
    d = declared_requirements(root, "demo_pkg")
    assert d.runtime == ["attrs>=22", "typing-extensions"]
    assert d.test == ["freezegun", "hypothesis"]  # pytest is pinned by the miner


def test_dependency_groups_with_include_group(tmp_path):
    # PEP 735, as in attrs or pip: a tests group including another
    root = _tree(tmp_path, {
        "pyproject.toml": """
            [project]
            name = "grouped"
            dependencies = ["idna>=3"]
            [project.optional-dependencies]
            socks = ["PySocks"]
            [dependency-groups]
            cov = ["coverage[toml]"]
            typing = ["mypy"]
            tests = [{include-group = "cov"}, "pytest-mock>=3", "pympler"]
            dev = [{include-group = "tests"}, "tox"]
            """,
    })
    d = declared_requirements(root, "grouped")
    assert d.runtime == ["idna>=3"]
    assert d.test == ["pytest-mock>=3", "pympler"]  # socks is not a test extra: a test group exists


def test_setup_cfg_and_requirements_dir(tmp_path):
    # setup.cfg projects with requirements/test.txt -r base.txt (e.g. markdown-it-py's older layout)
    root = _tree(tmp_path, {
        "setup.cfg": """
            [metadata]
            name = cfgpkg
            version = 2.0
            [options]
            install_requires =
                six>=1.10
                enum34; python_version < "3.4"
            [options.extras_require]
            testing =
                pytest-asyncio
            """,
        "requirements/base.txt": "six==1.16.0\n",
        "requirements/test.txt": "-r base.txt\n--index-url https://example.org\nresponses==0.23.1  # http mocks\n"
                                 "-e .\nhttps://example.org/x.tar.gz\n",
    })
    d = declared_requirements(root, "cfgpkg")
    assert d.runtime == ["six>=1.10"]
    assert d.test == ["pytest-asyncio", "six", "responses"]
    assert project_identity(root) == ("cfgpkg", "2.0")


def test_poetry_and_no_test_names_falls_back_to_extras_and_dev(tmp_path):
    root = _tree(tmp_path, {
        "pyproject.toml": """
            [tool.poetry]
            name = "poet"
            version = "0.3.1"
            [tool.poetry.dependencies]
            python = "^3.8"
            requests = "^2.28"
            local = {path = "../local"}
            [tool.poetry.extras]
            [tool.poetry.group.dev.dependencies]
            responses = "*"
            black = "^23"
            """,
    })
    d = declared_requirements(root, "poet")
    assert d.runtime == ["requests"]
    assert d.test == ["responses"]
    assert project_identity(root) == ("poet", "0.3.1")


@pytest.mark.slow
def test_resolve_pins_the_closure_and_drops_a_test_requirement_pip_cannot_install(tmp_path, backend):
    # needs PyPI for the miner's own pins; the runtime requirement comes from a local wheel
    wheel(tmp_path / "wheels", "octinydep-local", "0.1", {"octinydep/__init__.py": "X = 1\n"})
    declared = Declared(runtime=["octinydep-local>=0.1"], test=["oc-no-such-distribution-7f3a"])
    res = resolve(BASE_REQUIREMENTS, declared, "demo", backend, find_links=tmp_path / "wheels")
    assert "octinydep-local==0.1" in res.pins and {r.lower() for r in BASE_REQUIREMENTS} <= {p.lower() for p in res.pins}
    assert len(res.dropped) == 1 and res.dropped[0].startswith("oc-no-such-distribution-7f3a (")
    with pytest.raises(TaskError, match="runtime requirements"):
        resolve(BASE_REQUIREMENTS, Declared(runtime=["oc-no-such-distribution-7f3a"]), "demo", backend)
