"""Tests of tools/tray-stats, run as a program on hand-made dumps of a made-up map tile server
(fixtures/), and on a dump that traymalloc itself wrote when TRAY_STATS_REAL_DUMP names one.

fixtures/tilecache.jsonl: pid 4242, line 1 dumped on a signal, line 2 at exit; between them the
320 B class (13) leaks 4,000 session objects and 28 of the 4 KiB buffers go.
fixtures/tilecache_rerun.jsonl: one dump of a later run (pid 5170).

Run by ctest (tests/tools/CMakeLists.txt sets TRAY_STATS_TOOL), or directly:
  python3 tests/tools/tray_stats_test.py
"""

import copy
import importlib.util
import json
import os
import re
import subprocess
import tempfile
import unittest
import xml.etree.ElementTree as ElementTree
from importlib.machinery import SourceFileLoader
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOL = Path(os.environ.get("TRAY_STATS_TOOL") or HERE.parent.parent / "tools" / "tray-stats")
FIXTURES = HERE / "fixtures"
TILECACHE = FIXTURES / "tilecache.jsonl"
RERUN = FIXTURES / "tilecache_rerun.jsonl"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def load_tool():
    loader = SourceFileLoader("tray_stats", str(TOOL))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def run_tool(*arguments, env=None):
    return subprocess.run([str(TOOL), *map(str, arguments)], capture_output=True, text=True,
                          timeout=120, env=env)


def fixture_dumps(path=TILECACHE):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_dumps(folder, name, dumps):
    path = Path(folder) / name
    path.write_text("".join(json.dumps(d) + "\n" for d in dumps))
    return path


def table_rows(output, first_header):
    """Cells of the rows of the table whose header line starts with `first_header`, up to its
    rule or its end; the footer rows, if any, as a second list."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(first_header))
    rows, footer = [], []
    target = rows
    for line in lines[start + 1:]:
        if set(line) == {"-"}:
            target = footer
            continue
        cells = re.split(r"\s{2,}", line.strip())
        if not cells[0].isdigit() and cells[0] != "all":
            break
        target.append(cells)
    return rows, footer


def holding(dump):
    return [c for c in dump["classes"] if c["pages"] or c["live_blocks"] or c["allocations"]]


class OneDumpTest(unittest.TestCase):
    def setUp(self):
        self.result = run_tool(TILECACHE)
        self.assertEqual(self.result.returncode, 0, self.result.stderr)
        self.rows, self.footer = table_rows(self.result.stdout, "class")

    def test_reads_the_last_dump_by_default(self):
        self.assertTrue(self.result.stdout.startswith(
            f"{TILECACHE} line 2: pid 4242, exit, traymalloc 0.2.0\n"))

    def test_lists_the_classes_in_use_most_reserved_first(self):
        expected = sorted(holding(fixture_dumps()[1]),
                          key=lambda c: (-c["reserved_bytes"], -c["live_bytes"], c["class"]))
        self.assertEqual([int(r[0]) for r in self.rows], [c["class"] for c in expected])
        self.assertEqual(len(self.rows), 21)
        self.assertEqual(self.rows[0][0], "3")  # 48 B: 35 pages, the most reserved
        # Six classes hold one 64 KiB page each: the most live bytes first.
        tied = [r[0] for r in self.rows if r[8] == "64.0 KiB"]
        self.assertEqual(tied, ["7", "28", "9", "32", "11", "0"])
        self.assertNotIn("12", [r[0] for r in self.rows])  # 256 B: never used

    def test_row_of_the_leaking_class(self):
        row = next(r for r in self.rows if r[0] == "13")
        self.assertEqual(row, ["13", "320", "5,200", "5,200", "21,000", "15,800", "26",
                               "1.6 MiB", "1.6 MiB", "98.0", "7.5"])

    def test_class_with_allocations_only_shows_zero_bytes(self):
        row = next(r for r in self.rows if r[0] == "36")
        self.assertEqual(row[1:], ["16,384", "0", "4", "20", "20", "0", "0 B", "0 B", "0.0",
                                   "8.4"])

    def test_totals_count_every_class(self):
        self.assertEqual(self.footer, [["all", "116,723", "2,421,209", "2,304,486", "154",
                                        "9.8 MiB", "11.6 MiB", "84.5", "9.2"]])

    def test_large_blocks_and_process(self):
        out = self.result.stdout
        self.assertRegex(out, r"\n  live +6 blocks, 6\.2 MiB \(peak 8\.0 MiB\)\n")
        self.assertRegex(out, r"\n  allocations +52, frees 46\n")
        self.assertRegex(out, r"\n  committed +19\.4 MiB\n")
        self.assertRegex(out, r"\n  metadata +368\.0 KiB\n")
        self.assertRegex(out, r"\n  threads +1 alive, 11 exited, 14 heaps created\n")
        self.assertRegex(out, r"\n  remote frees +30,117\n")
        self.assertRegex(out, r"\n  OS calls +mmap 21, munmap 11, madvise 412, mremap 3, "
                              r"mprotect 0\n")

    def test_top_limits_rows_not_totals(self):
        result = run_tool("--top", 3, TILECACHE)
        rows, footer = table_rows(result.stdout, "class")
        self.assertEqual([r[0] for r in rows], ["3", "4", "44"])
        self.assertEqual(footer, self.footer)
        self.assertIn("(18 more classes not shown", result.stdout)

    def test_index_picks_an_earlier_dump(self):
        for index in ("0", "-2"):
            result = run_tool("--index", index, TILECACHE)
            self.assertIn(f"{TILECACHE} line 1: pid 4242, signal", result.stdout)
            row = next(r for r in table_rows(result.stdout, "class")[0] if r[0] == "13")
            self.assertEqual(row[2], "1,200")


class NewerAndBrokenDumpTest(unittest.TestCase):
    """Dumps made from the fixture with one thing changed, each in its own file."""

    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        self.exit_dump = fixture_dumps()[1]

    def tearDown(self):
        self.folder.cleanup()

    def run_on(self, dumps, *options):
        return run_tool(*options, write_dumps(self.folder.name, "dump.jsonl", dumps))

    def assert_fails(self, result, *phrases):
        self.assertEqual(result.returncode, 1, result.stdout)
        self.assertEqual(result.stdout, "")
        for phrase in phrases:
            self.assertIn(phrase, result.stderr)

    def test_unknown_keys_ignored_and_absent_ratios_computed(self):
        dump = copy.deepcopy(self.exit_dump)
        dump["arenas"] = [1, 2]
        dump["process"]["huge_pages"] = 3
        for c in dump["classes"]:
            c["sampled"] = True
            del c["utilization"], c["internal_waste"]
        result = self.run_on([dump])
        self.assertEqual(result.returncode, 0, result.stderr)
        rows = {r[0]: r for r in table_rows(result.stdout, "class")[0]}
        self.assertEqual(rows["13"][9:], ["98.0", "7.5"])  # 5200/(26*204); 1 - 296/320
        self.assertEqual(rows["1"][9:], ["57.4", "15.6"])  # 9400/(4*4096); 1 - 13.5/16
        self.assertEqual(rows["40"][9:], ["0.0", "8.4"])   # one empty page

    def test_missing_required_keys(self):
        for section, key, where in ((("classes", 13), "live_blocks", "classes[13].live_blocks"),
                                    (("process",), "committed_bytes", "process.committed_bytes"),
                                    ((), "pid", "pid")):
            dump = copy.deepcopy(self.exit_dump)
            target = dump
            for step in section:
                target = target[step]
            del target[key]
            with self.subTest(where):
                self.assert_fails(self.run_on([dump]), "dump.jsonl line 1: ",
                                  f"missing key {where}")

    def test_wrong_type(self):
        dump = copy.deepcopy(self.exit_dump)
        dump["classes"][2]["pages"] = "10"
        self.assert_fails(self.run_on([dump]), 'classes[2].pages is "10", not an integer')

    def test_other_format_version(self):
        dump = copy.deepcopy(self.exit_dump)
        dump["traymalloc_stats"] = 3
        self.assert_fails(self.run_on([dump]), "line 1: format version 3",
                          "reads versions 1 and 2")

    def test_not_a_dump(self):
        self.assert_fails(self.run_on([{"hello": 1}]), "not a traymalloc statistics dump")

    def test_bad_line_named_and_blank_lines_skipped(self):
        good = json.dumps(self.exit_dump)
        path = Path(self.folder.name) / "crashed.jsonl"
        path.write_text(f"{good}\n\n{good}\n   \n")
        result = run_tool(path)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(result.stdout.startswith(f"{path} line 3: pid 4242"))
        path.write_text(f"{good}\n\n{good[:5000]}\n")
        self.assert_fails(run_tool(path), f"{path} line 3: not JSON")

    def test_text_dump_gets_told_how_to_write_json(self):
        path = Path(self.folder.name) / "text.log"
        path.write_text("traymalloc: stats: pid=28716 reason=exit\n"
                        "      class blocks/page       live       peak        allocs\n")
        self.assert_fails(run_tool(path), f"{path} line 1: not JSON but a text dump",
                          "tray-stats reads JSON dumps only",
                          "TRAY_OPTIONS=stats_format=json,stats_file=PATH")
        # A JSON file cut short names its line and column, and the same remedy.
        path.write_text('{"traymalloc_stats":1,\n')
        self.assert_fails(run_tool(path), f"{path} line 1: not JSON (", "column ",
                          "stats_format=json")

    def test_empty_missing_and_out_of_range(self):
        empty = Path(self.folder.name) / "empty.jsonl"
        empty.write_text("\n\n")
        self.assert_fails(run_tool(empty), "empty.jsonl holds no dump")
        self.assert_fails(run_tool(empty.with_name("absent.jsonl")), "cannot read",
                          "absent.jsonl")
        self.assert_fails(run_tool("--index", 2, TILECACHE),
                          "holds 2 dump(s): --index 2 is out of range")


class GrowthTest(unittest.TestCase):
    def assert_tilecache_growth(self, result, old_source, new_source):
        self.assertEqual(result.returncode, 0, result.stderr)
        out = result.stdout
        self.assertTrue(out.startswith(f"from  {old_source}: pid 4242, signal, traymalloc 0.2.0\n"
                                       f"to    {new_source}: pid 4242, exit, traymalloc 0.2.0\n"))
        self.assertNotIn("note:", out)
        self.assertRegex(out, r"\nlive bytes +\+1\.8 MiB in size classes, \+2\.0 MiB in large")
        self.assertRegex(out, r"\nlarge live blocks +4 -> 6 \(\+2\)\n")
        self.assertRegex(out, r"\ncommitted +17\.2 MiB -> 19\.4 MiB \(\+2\.2 MiB\)\n")
        rows, _ = table_rows(out, "class")
        self.assertEqual(rows[0], ["13", "320", "1,200", "5,200", "+4,000", "+1.2 MiB",
                                   "1.6 MiB"])
        self.assertEqual(rows[1][:6], ["44", "65,536", "20", "28", "+8", "+512.0 KiB"])
        self.assertEqual(rows[2][:6], ["28", "4,096", "40", "12", "-28", "-112.0 KiB"])
        old, new = fixture_dumps()
        changed = [(a["live_bytes"] - b["live_bytes"], a["block_bytes"], str(b["class"]))
                   for a, b in zip(new["classes"], old["classes"])
                   if a["live_blocks"] != b["live_blocks"]]
        # Largest change first, grown or shrunk; classes 1 and 8 both grew by 6,400 B: the
        # smaller blocks first.
        changed.sort(key=lambda c: (-abs(c[0]), c[1]))
        self.assertEqual([r[0] for r in rows], [c[2] for c in changed])
        self.assertNotIn("7", [r[0] for r in rows])  # 500 live blocks in both
        self.assertIn("13 grew, 2 shrank", out)

    def test_one_file_twice_compares_its_last_two_dumps(self):
        self.assert_tilecache_growth(run_tool(TILECACHE, TILECACHE),
                                     f"{TILECACHE} line 1", f"{TILECACHE} line 2")

    def test_two_files(self):
        with tempfile.TemporaryDirectory() as folder:
            old, new = fixture_dumps()
            old_path = write_dumps(folder, "old.jsonl", [old])
            new_path = write_dumps(folder, "new.jsonl", [new])
            self.assert_tilecache_growth(run_tool(old_path, new_path),
                                         f"{old_path} line 1", f"{new_path} line 1")

    def test_different_processes_noted(self):
        result = run_tool("--top", 1, RERUN, TILECACHE)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("note: the dumps come from different processes (pid 5170 and 4242)",
                      result.stdout)
        rows, _ = table_rows(result.stdout, "class")
        self.assertEqual(rows, [["13", "320", "1,080", "5,200", "+4,120", "+1.3 MiB",
                                 "1.6 MiB"]])

    def test_top_keeps_the_largest_changes_grown_or_shrunk(self):
        # From the signal dump: class 4 (64 B) frees 18 MiB, class 3 (48 B) loses 4 KiB and
        # class 13 (320 B) grows by 1.2 MiB.
        old, _ = fixture_dumps()
        new = copy.deepcopy(old)
        old["classes"][4].update(live_blocks=300_000 + 30_000, live_bytes=(300_000 + 30_000) * 64)
        self.assertEqual(new["classes"][4]["live_blocks"], 30_000)
        new["classes"][3].update(live_blocks=42_000 - 85, live_bytes=(42_000 - 85) * 48)
        new["classes"][13].update(live_blocks=5_200, live_bytes=5_200 * 320)
        with tempfile.TemporaryDirectory() as folder:
            path = write_dumps(folder, "two.jsonl", [old, new])
            result = run_tool("--top", 2, path, path)
        self.assertEqual(result.returncode, 0, result.stderr)
        rows, _ = table_rows(result.stdout, "class")
        self.assertEqual([(r[0], r[5]) for r in rows], [("4", "-18.3 MiB"), ("13", "+1.2 MiB")])
        self.assertIn("1 grew, 2 shrank; largest change of live bytes first", result.stdout)
        self.assertIn("(1 more changed classes not shown)", result.stdout)

    def test_same_dump_twice_refused(self):
        result = run_tool("--old-index", -1, TILECACHE, TILECACHE)
        self.assertEqual(result.returncode, 1)
        self.assertIn("OLD and NEW are the same dump", result.stderr)
        result = run_tool("--index", 0, TILECACHE, TILECACHE)
        self.assertIn("is the file's first dump", result.stderr)


class ChartTest(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        self.out = Path(self.folder.name)

    def tearDown(self):
        self.folder.cleanup()

    def chart(self, name, *options, dump=TILECACHE, env=None):
        path = self.out / name
        result = run_tool("--chart", path, *options, dump, env=env)
        if result.returncode == 2 and "python3-matplotlib" in result.stderr and env is None:
            self.skipTest("matplotlib is not installed for the tool's interpreter")
        return path, result

    def test_png_with_the_table(self):
        path, result = self.chart("classes.png")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(table_rows(result.stdout, "class")[0][0][0], "3")
        self.assertIn(f"wrote {path}", result.stderr)
        data = path.read_bytes()
        self.assertTrue(data.startswith(PNG_SIGNATURE))
        self.assertGreater(len(data), 20_000)

    def test_svg_linear_scale(self):
        path, result = self.chart("classes.svg")
        self.assertEqual(result.returncode, 0, result.stderr)
        root = ElementTree.parse(path).getroot()
        self.assertEqual(root.tag, "{http://www.w3.org/2000/svg}svg")
        text = path.read_text()
        self.assertIn("<svg", text)
        # Matplotlib keeps each text of the figure as a comment in its SVG.
        self.assertIn("pid 4242 (dump at exit)", text)
        self.assertIn("reserved bytes, in MiB", text)
        self.assertIn("% of the class's reserved bytes", text)
        self.assertIn("320 B (class 13)", text)
        self.assertIn("all 21 classes in use", text)

    def test_svg_of_the_top_classes_only(self):
        path, result = self.chart("top.svg", "--top", 3)
        self.assertEqual(result.returncode, 0, result.stderr)
        text = path.read_text()
        for block, index in (("48", 3), ("64", 4), ("65,536", 44)):
            self.assertIn(f"{block} B (class {index})", text)
        self.assertNotIn("(class 13)", text)
        self.assertIn("the 3 of 21 classes reserving the most", text)
        self.assertNotIn("log", text.replace("dialog", ""))

    def test_other_extension_refused(self):
        path, result = self.chart("classes.pdf")
        self.assertEqual(result.returncode, 2)
        self.assertIn("must end in .png or .svg", result.stderr)
        self.assertFalse(path.exists())

    def test_chart_of_two_dumps_refused(self):
        result = run_tool("--chart", self.out / "c.png", TILECACHE, TILECACHE)
        self.assertEqual(result.returncode, 2)
        self.assertIn("--chart draws one dump", result.stderr)

    def test_missing_matplotlib(self):
        # A matplotlib package that cannot be imported, ahead of the real one.
        fake = self.out / "fake" / "matplotlib"
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
        env = dict(os.environ, PYTHONPATH=str(fake.parent))
        path, result = self.chart("classes.png", env=env)
        self.assertEqual(result.returncode, 2)
        self.assertIn("apt-get install python3-matplotlib", result.stderr)
        self.assertEqual(result.stdout, "")
        self.assertFalse(path.exists())


class ChartDataTest(unittest.TestCase):
    """What the chart is drawn from, tested without matplotlib."""

    def rows(self, dumps, top):
        tool = load_tool()
        with tempfile.TemporaryDirectory() as folder:
            dump = tool.load_dump(write_dumps(folder, "d.jsonl", dumps), -1)
        return tool.chart_rows(dump, top)

    def test_top_keeps_the_tables_first_classes(self):
        rows = self.rows(fixture_dumps(), 3)
        self.assertEqual([r.size_class.index for r in rows], [3, 4, 44])
        self.assertEqual(len(self.rows(fixture_dumps(), None)), 21)
        self.assertEqual(len(self.rows(fixture_dumps(), 100)), 21)

    def test_shares_are_linear_whatever_the_classes_sizes(self):
        # Class 4 (64 B) reserves 400 pages, 25 MiB, of which 6% are live; class 0 (8 B) one
        # page, 64 KiB. A log axis drew class 4 as if 40% used.
        dump = fixture_dumps()[1]
        busy = dump["classes"][4]
        live = 400 * 1024 * 6 // 100
        busy.update(pages=400, reserved_bytes=400 * 65536, live_blocks=live,
                    live_bytes=live * 64, frees=busy["allocations"] - live, utilization=0.06)
        rows = {r.size_class.index: r for r in self.rows([dump], None)}
        requested, waste, free = rows[4].shares
        self.assertAlmostEqual(requested + waste, 0.06, places=3)
        self.assertAlmostEqual(waste / (requested + waste), 0.125, places=3)  # 1 - 56/64
        self.assertAlmostEqual(free, 0.94, places=3)
        self.assertEqual(rows[4].length, 400 * 65536)
        for row in rows.values():
            self.assertAlmostEqual(sum(row.shares), 1.0 if row.length else 0.0)
        self.assertAlmostEqual(rows[0].shares[2], 1 - 17_200 / 65_536, places=3)
        self.assertEqual(rows[36].shares, (0.0, 0.0, 0.0))  # allocations only, no pages


class FormattingTest(unittest.TestCase):
    def test_human_bytes(self):
        human_bytes = load_tool().human_bytes
        cases = [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
                 (1048575, "1.0 MiB"), (int(1.25 * 2**30), "1.2 GiB"),
                 (3 * 2**40, "3072.0 GiB"), (99.6, "100 B")]
        for value, text in cases:
            self.assertEqual(human_bytes(value), text)
        self.assertEqual(human_bytes(-2048, signed=True), "-2.0 KiB")
        self.assertEqual(human_bytes(400, signed=True), "+400 B")
        self.assertEqual(human_bytes(0, signed=True), "0 B")


@unittest.skipUnless(os.environ.get("TRAY_STATS_REAL_DUMP"),
                     "TRAY_STATS_REAL_DUMP names no dump written by traymalloc")
class RealDumpTest(unittest.TestCase):
    def setUp(self):
        self.path = Path(os.environ["TRAY_STATS_REAL_DUMP"])
        self.dump = fixture_dumps(self.path)[-1]

    def test_table(self):
        result = run_tool(self.path)
        self.assertEqual(result.returncode, 0, result.stderr)
        rows, footer = table_rows(result.stdout, "class")
        self.assertEqual(len(rows), len(holding(self.dump)))
        human_bytes = load_tool().human_bytes
        reserved = sum(c["reserved_bytes"] for c in self.dump["classes"])
        self.assertEqual(footer[0][6], human_bytes(reserved))
        self.assertIn("\nprocess\n", result.stdout)

    def test_chart(self):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "real.png"
            result = run_tool("--chart", path, self.path)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertTrue(path.read_bytes().startswith(PNG_SIGNATURE))


if __name__ == "__main__":
    unittest.main()
