"""Tests of tools/tray-timeline, run as a program and as a module on timelines written here:
soak samples (bench/workloads/soak --timeline) and traymalloc JSON dumps (stats_interval), the
latter small ones or whole dumps made from fixtures/tilecache.jsonl.

Run by ctest (tests/tools/CMakeLists.txt sets TRAY_TIMELINE_TOOL), or directly:
  python3 tests/tools/tray_timeline_test.py
"""

import copy
import importlib.util
import json
import os
import subprocess
import tempfile
import unittest
from importlib.machinery import SourceFileLoader
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOL = Path(os.environ.get("TRAY_TIMELINE_TOOL") or HERE.parent.parent / "tools" / "tray-timeline")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIB = 1 << 20
TILECACHE = HERE / "fixtures" / "tilecache.jsonl"


def load_tool():
    loader = SourceFileLoader("tray_timeline", str(TOOL))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def soak_line(t, rss_mib, live_mib, tray=True):
    record = {"t": t, "event": "tick", "phase": 0, "band": "small", "rss": rss_mib * MIB,
              "live": live_mib * MIB}
    if tray:
        # Two classes of the 16-256 B group and one of 4-16 KiB: [block, live, reserved].
        record["tray"] = {"committed": rss_mib * MIB, "large_live": 0, "large_cached": MIB,
                          "classes": [[16, MIB, 2 * MIB], [256, 3 * MIB, 4 * MIB],
                                      [8192, 5 * MIB, 8 * MIB]]}
    return json.dumps(record)


def dump_line(time_ms, resident_mib, with_time=True):
    classes = [{"block_bytes": 64, "live_bytes": 2 * MIB, "reserved_bytes": 3 * MIB},
               {"block_bytes": 4096, "live_bytes": MIB, "reserved_bytes": 2 * MIB}]
    record = {"traymalloc_stats": 1, "reason": "interval", "classes": classes,
              "large": {"live_bytes": 4 * MIB, "cached_bytes": 0},
              "process": {"resident_bytes": resident_mib * MIB}}
    if with_time:
        record["time_ms"] = time_ms
    return json.dumps(record)


def server_dumps(minutes, rss_mib, reserved_mib):
    """One stats_interval dump a minute, as a server writes them: the tile cache's exit dump
    with its time, RSS and the reserved bytes of some classes (block size -> MiB) set by the
    minute; live bytes stay as they are, 9.8 MiB in classes and 6.2 MiB in large blocks."""
    template = json.loads(TILECACHE.read_text().splitlines()[1])
    template["reason"] = "interval"
    lines = []
    for minute in minutes:
        dump = copy.deepcopy(template)
        dump["time_ms"] = 5_000 + 60_000 * minute
        dump["process"]["resident_bytes"] = round(rss_mib(minute) * MIB)
        for entry in dump["classes"]:
            if entry["block_bytes"] in reserved_mib:
                entry["reserved_bytes"] = round(reserved_mib[entry["block_bytes"]](minute) * MIB)
        lines.append(json.dumps(dump, separators=(",", ":")))
    return lines


def live_of_tilecache():
    dump = json.loads(TILECACHE.read_text().splitlines()[1])
    return sum(c["live_bytes"] for c in dump["classes"]) + dump["large"]["live_bytes"]


class TrayTimelineTest(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        self.dir = Path(self.folder.name)

    def tearDown(self):
        self.folder.cleanup()

    def write(self, name, lines):
        path = self.dir / name
        path.write_text("\n".join(lines) + "\n")
        return path

    def run_tool(self, *arguments):
        return subprocess.run([str(TOOL), *map(str, arguments)], capture_output=True, text=True,
                              timeout=120)

    def test_soak_timelines_of_two_allocators_make_a_chart(self):
        tray = self.write("tray.jsonl", [soak_line(t / 10, 60 + t, 48) for t in range(20)])
        glibc = self.write("glibc.jsonl", [soak_line(t / 10, 90, 48, tray=False) for t in range(20)])
        out = self.dir / "chart.png"
        result = self.run_tool("--out", out, f"traymalloc={tray}", f"glibc={glibc}")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(out.read_bytes()[:8], PNG_SIGNATURE)

    def test_stats_interval_dumps_make_a_chart(self):
        dumps = self.write("server.jsonl", [dump_line(1000 + 60000 * i, 50 + i) for i in range(5)])
        out = self.dir / "server.svg"
        result = self.run_tool("--out", out, dumps)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("<svg", out.read_text())

    def test_samples_are_grouped_by_class_size(self):
        tool = load_tool()
        samples = tool.read_samples(self.write("tray.jsonl", [soak_line(0.5, 70, 48)]))
        self.assertEqual(samples[0]["classes"]["16-256 B"], (4 * MIB, 6 * MIB))
        self.assertEqual(samples[0]["classes"]["4-16 KiB"], (5 * MIB, 8 * MIB))
        dumps = tool.read_samples(self.write("d.jsonl", [dump_line(5000, 40), dump_line(7500, 41)]))
        self.assertEqual([d["t"] for d in dumps], [0.0, 2.5])
        self.assertEqual(dumps[1]["live"], 7 * MIB)  # classes and large blocks

    def test_trend_gives_the_slope_per_hour_and_quarter_means(self):
        # One phase a minute whose RSS / live climbs by 0.01: a slope of 0.6 per hour.
        lines = []
        for minute in range(60):
            record = json.loads(soak_line(minute * 60.0, 0, 48, tray=False))
            record.update(phase=minute, rss=int((1.5 + 0.01 * minute) * 48 * MIB))
            lines.append(json.dumps(record))
        result = self.run_tool("--trend", f"hour={self.write('hour.jsonl', lines)}")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("slope +0.600 per hour", result.stdout)
        self.assertIn("first quarter's phases 1.570", result.stdout)
        self.assertIn("last quarter's 2.020", result.stdout)

    def test_least_footprint_follows_random_deaths_and_refills(self):
        tool = load_tool()
        footprint = tool.LeastFootprint()
        os_pages = 64
        packed = os_pages * 64  # 64-byte blocks, 64 per OS page
        self.assertAlmostEqual(footprint.update([[64, packed * 64, 0]]), os_pages * 4096)
        # One block in 64 left: each OS page is in use with the chance 1 - (63/64)^64.
        expected = os_pages * (1 - (63 / 64) ** 64) * 4096
        self.assertAlmostEqual(footprint.update([[64, os_pages * 64, 0]]), expected, delta=1)
        # The class grows again into its holes: the OS pages in use do not change until the
        # live blocks need more of them.
        self.assertAlmostEqual(footprint.update([[64, os_pages * 64 * 20, 0]]), expected, delta=64)
        self.assertAlmostEqual(footprint.update([[64, packed * 64, 0]]), os_pages * 4096, delta=64)
        # Blocks of an OS page or more need no more than their bytes.
        self.assertEqual(footprint.update([[8192, 5 * 8192, 0]]), 5 * 8192)

    def test_phases_table_has_a_row_per_phase_and_the_second_half(self):
        lines = [json.dumps({"t": 0, "event": "start", "phase": -1, "band": "", "rss": MIB,
                             "live": 0})]
        for phase in range(4):
            record = json.loads(soak_line(phase + 0.5, 60, 48))
            record.update(phase=phase, requested=40 * MIB, index=MIB)
            lines.append(json.dumps(record))
        result = self.run_tool("--phases", f"t={self.write('p.jsonl', lines)}")
        self.assertEqual(result.returncode, 0, result.stderr)
        rows = [line for line in result.stdout.splitlines() if line.split()[:1] in (["0"], ["3"])]
        self.assertEqual(len(rows), 2)
        self.assertIn("1.25", rows[0])  # RSS / live, 60 over 48
        self.assertIn("second half: RSS / live 1.250", result.stdout)

    def test_summary_of_a_server_without_phases(self):
        # An hour of dumps: RSS creeps by 0.5 MiB a minute; the 64 B class reserves 0.2 MiB
        # more each minute, the 4 KiB class 1 MiB more in all, the 320 B class gives back.
        lines = server_dumps(range(61), lambda m: 40 + 0.5 * m,
                             {64: lambda m: 2 + 0.2 * m, 4096: lambda m: 1 + m / 60,
                              320: lambda m: 3 - m / 30})
        path = self.write("server.jsonl", lines)
        live = live_of_tilecache()
        for options in ((), ("--summary",), ("--trend",), ("--phases",)):
            with self.subTest(options=options):
                result = self.run_tool(*options, f"server={path}")
                self.assertEqual(result.returncode, 0, result.stderr)
                out = result.stdout
                self.assertNotIn("fewer than 2 phases", out)
                self.assertIn("server: 61 samples over 60.0 min\n", out)
                self.assertRegex(out, r"\n  RSS +40\.0 MiB -> 70\.0 MiB; slope \+30\.0 MiB per "
                                      r"hour\n")
                slope = 30 * MIB / live
                first = (40 + 0.5 * 7) * MIB / live   # minutes 0-14
                last = (40 + 0.5 * 52.5) * MIB / live  # minutes 45-60
                self.assertIn(f"slope {slope:+.3f} per hour; mean of the first quarter "
                              f"{first:.3f}, of the last quarter {last:.3f}", out)
                classes = [line.split()[0] for line in out.splitlines()
                           if line.startswith("    ") and " B: " in line]
                self.assertEqual(classes, ["64", "4,096"])
                self.assertIn("     64 B: 2.0 MiB -> 14.0 MiB (+12.0 MiB), live 1.9 MiB", out)
                if options in (("--trend",), ("--phases",)):
                    self.assertIn("server: no phases (not a soak timeline): the summary", out)

    def test_worst_window_is_where_rss_grew_most(self):
        # RSS creeps by 0.5 MiB a minute and jumps by 25 MiB at minute 41: every window of six
        # minutes (a tenth of the hour) that holds the jump grew by 28 MiB; the first is named.
        lines = server_dumps(range(61), lambda m: 40 + 0.5 * m + (25 if m >= 41 else 0), {})
        tool = load_tool()
        summary = "\n".join(tool.summary("s", tool.read_samples(self.write("s.jsonl", lines))))
        self.assertIn("worst window  35.0 min to 41.0 min: RSS 57.5 MiB -> 85.5 MiB "
                      "(+28.0 MiB)", summary)
        self.assertIn("no size class reserves more at the last sample than at the first", summary)

    def test_dumps_of_two_processes_in_one_file(self):
        # A wrapper preloaded with the same options (timeout, a shell) appends to the same file.
        server = server_dumps(range(10), lambda m: 40 + m, {})
        wrapper = [json.loads(line) for line in server_dumps(range(12), lambda m: 2, {})]
        for dump in wrapper:
            dump.update(pid=99, time_ms=dump["time_ms"] - 30_000)
        lines = [line for pair in zip(map(json.dumps, wrapper), server) for line in pair]
        result = self.run_tool("--summary", f"s={self.write('two.jsonl', lines)}")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("holds the dumps of 2 processes; showing the 10 of pid 4242, the largest",
                      result.stderr)
        self.assertIn("s: 10 samples over 9.0 min\n  RSS           40.0 MiB -> 49.0 MiB",
                      result.stdout)

    def test_summary_of_a_single_dump(self):
        result = self.run_tool(self.write("one.jsonl", server_dumps([0], lambda m: 40, {})))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("1 sample over 0.0 s\n  fewer than 2 points in time: no trend", result.stdout)

    def test_bad_input_is_refused(self):
        out = self.dir / "x.png"
        for name, lines, message in (
                ("old.jsonl", [dump_line(0, 1, with_time=False)], "without time_ms"),
                ("text.jsonl", ["not json"], "not JSON"),
                ("text.log", ["traymalloc: stats: pid=1 reason=exit"], "stats_format=json"),
                ("other.jsonl", [json.dumps({"a": 1})], "neither")):
            result = self.run_tool("--out", out, self.write(name, lines))
            self.assertEqual(result.returncode, 1, name)
            self.assertIn(message, result.stderr)
        self.assertEqual(self.run_tool("--out", self.dir / "x.jpg", "a=b").returncode, 2)


if __name__ == "__main__":
    unittest.main()
