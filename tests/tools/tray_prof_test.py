"""Tests of tools/tray-prof diff, run as a program on heap profiles written here. Their stacks
point outside any mapped file, so each site is named by its address and no symbols are read.

Run by ctest (tests/tools/CMakeLists.txt sets TRAY_PROF_TOOL), or directly:
  python3 tests/tools/tray_prof_test.py
"""

import json
import os
import subprocess
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOL = Path(os.environ.get("TRAY_PROF_TOOL") or HERE.parent.parent / "tools" / "tray-prof")
RATE = 512 * 1024


def profile_text(stacks):
    """A heap_v2 profile of `stacks`: (sampled blocks, sampled bytes, [return addresses])."""
    blocks = sum(s[0] for s in stacks)
    size = sum(s[1] for s in stacks)
    lines = [f"heap profile: {blocks:5d}: {size:8d} [{blocks:5d}: {size:8d}] @ heap_v2/{RATE}"]
    lines += [f"{b:6d}: {n:8d} [{b:6d}: {n:8d}] @ " + " ".join(f"0x{a:x}" for a in addresses)
              for b, n, addresses in stacks]
    return "\n".join(lines + ["", "MAPPED_LIBRARIES:", ""])


# Site 0x1100 holds the same samples in both, in two stacks listed in another order, so that
# its estimates are summed in another order; 0x1200 is the same in both; 0x2000 grows, 0x3000
# goes and 0x4000 comes.
OLD = [(3, 3 * 1000, [0x1100, 0x9000]), (7, 7 * 333, [0x1100, 0x9100]),
       (2, 2 * 4096, [0x1200, 0x9000]),
       (4, 4 * 65536, [0x2000, 0x9000]),
       (5, 5 * 100, [0x3000, 0x9000])]
NEW = [(7, 7 * 333, [0x1100, 0x9100]), (3, 3 * 1000, [0x1100, 0x9000]),
       (2, 2 * 4096, [0x1200, 0x9000]),
       (9, 9 * 65536, [0x2000, 0x9000]),
       (1, 200_000, [0x4000, 0x9000])]


class DiffTest(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        folder = Path(self.folder.name)
        self.old, self.new = folder / "old.heap", folder / "new.heap"
        self.old.write_text(profile_text(OLD))
        self.new.write_text(profile_text(NEW))

    def tearDown(self):
        self.folder.cleanup()

    def diff(self, *options):
        result = subprocess.run([str(TOOL), "diff", *options, str(self.old), str(self.new)],
                                capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stdout

    def test_unchanged_sites_are_left_out(self):
        lines = self.diff().splitlines()
        self.assertIn("3 sites changed, 2 unchanged (not shown)", lines[0])
        # Largest change first: +2.7 MiB, -2.5 MiB (small blocks weigh more), +615.9 KiB.
        self.assertEqual([line.split()[-1] for line in lines[2:]], ["0x2000", "0x3000", "0x4000"])
        self.assertEqual([line.split()[0][0] for line in lines[2:]], ["+", "-", "+"])
        self.assertNotIn("+0 B", "\n".join(lines))

    def test_json_leaves_them_out_too(self):
        changed = json.loads(self.diff("--json"))
        self.assertEqual(sorted(changed), ["0x2000", "0x3000", "0x4000"])
        self.assertGreater(changed["0x2000"]["bytes_delta"], 0)
        self.assertLess(changed["0x3000"]["bytes_delta"], 0)

    def test_n_counts_changed_sites(self):
        lines = self.diff("-n", "1").splitlines()
        self.assertEqual(len(lines), 3)
        self.assertTrue(lines[2].endswith("0x2000"))

    def test_no_change_at_all(self):
        self.new.write_text(profile_text(OLD))
        self.assertEqual(self.diff().splitlines()[1:], [])
        self.assertIn("0 sites changed, 4 unchanged", self.diff())


if __name__ == "__main__":
    unittest.main()
