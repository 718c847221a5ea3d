"""docs/recipes.md runs: every Python block of the page, in order, in one namespace (on the
CPU backend), with the asserts that hold its text to what the calls do."""

import re
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"


def test_every_recipe_runs():
    blocks = re.findall(r"```python\n(.*?)```", RECIPES.read_text(), flags=re.S)
    assert len(blocks) >= 5
    namespace = {"__name__": "recipes"}
    for block in blocks:
        exec(compile(block, str(RECIPES), "exec"), namespace)  # noqa: S102 - the page's own code
