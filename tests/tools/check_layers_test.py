#!/usr/bin/env python3
"""tools/check-layers: passes on this checkout, and fails on small trees that break each rule."""
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = Path(os.environ.get("TRAY_CHECK_LAYERS", ROOT / "tools" / "check-layers"))

DESIGN = """# Design
## Layers
| folder | what |
|---|---|
| `low` | the bottom |
| `mid` | the middle |
| `top` | the top |

## Next
"""


def run(root):
    result = subprocess.run([sys.executable, str(TOOL), "--root", str(root)],
                            capture_output=True, text=True, timeout=120)
    return result.returncode, result.stdout + result.stderr


class Tree:
    """A small repository: lib/LAYERS (low, mid, top), umbrellas, and docs/DESIGN.md."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = Path(self.dir.name)
        self.write("lib/LAYERS", "# lowest first\nlow   the bottom\nmid   the middle\ntop   the top\n")
        self.write("lib/CMakeLists.txt", "")
        self.write("lib/low/low.hpp", "#pragma once\n")
        self.write("lib/mid/mid.hpp", '#pragma once\n#include "low/low.hpp"\n')
        self.write("lib/mid/mid.cpp", '#include "mid/mid.hpp"\n#include "traymalloc.h"\n')
        self.write("lib/top/top.cpp", '#include "mid/mid.hpp"\n#include "low/low.hpp"\n')
        self.write("docs/DESIGN.md", DESIGN)

    def write(self, relative, text):
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


class CheckLayersTest(unittest.TestCase):
    def test_this_checkout_passes(self):
        code, output = run(ROOT)
        self.assertEqual(code, 0, output)

    def test_a_clean_tree_passes(self):
        tree = Tree()
        code, output = run(tree.root)
        self.assertEqual(code, 0, output)
        self.assertIn("3 layers", output)

    def expect_breach(self, tree, words):
        code, output = run(tree.root)
        self.assertEqual(code, 1, output)
        self.assertIn(words, output)

    def test_an_include_that_points_up_fails(self):
        tree = Tree()
        tree.write("lib/low/low.cpp", '#include "mid/mid.hpp"\n')
        self.expect_breach(tree, "lib/low/low.cpp:1: low includes mid/mid.hpp, from mid, a layer above it")

    def test_two_folders_that_include_each_other_fail(self):
        tree = Tree()
        tree.write("lib/low/low.hpp", '#pragma once\n#include "mid/mid.hpp"\n')
        self.expect_breach(tree, "a layer above it")

    def test_a_private_header_of_another_layer_fails(self):
        tree = Tree()
        tree.write("lib/low/detail.hpp", "#pragma once\n")
        tree.write("lib/mid/other.cpp", '#include "low/detail.hpp"\n')
        self.expect_breach(tree, "a private header of low; include low/low.hpp")

    def test_a_bare_include_fails(self):
        tree = Tree()
        tree.write("lib/mid/other.cpp", '#include "mid.hpp"\n')
        self.expect_breach(tree, "names no layer's folder")

    def test_a_file_directly_in_lib_fails(self):
        tree = Tree()
        tree.write("lib/stray.cpp", "")
        self.expect_breach(tree, "lib/stray.cpp: sits in no layer")

    def test_an_unlisted_folder_fails(self):
        tree = Tree()
        tree.write("lib/extra/extra.hpp", "#pragma once\n")
        self.expect_breach(tree, "lib/extra/: a folder lib/LAYERS does not list")

    def test_a_missing_umbrella_fails(self):
        tree = Tree()
        (tree.root / "lib/mid/mid.hpp").unlink()
        self.expect_breach(tree, "lib/mid/mid.hpp: the layer's umbrella header is missing")

    def test_a_long_file_fails(self):
        tree = Tree()
        tree.write("lib/mid/long.cpp", "int x;\n" * 601)
        self.expect_breach(tree, "601 lines, more than 600")

    def test_design_in_another_order_fails(self):
        tree = Tree()
        tree.write("docs/DESIGN.md", DESIGN.replace("`low`", "`tmp`").replace("`mid`", "`low`")
                   .replace("`tmp`", "`mid`"))
        self.expect_breach(tree, "docs/DESIGN.md: its Layers table lists mid low top")


if __name__ == "__main__":
    unittest.main(verbosity=2)
