"""Tests of tools/tray-timeline, run as a program and as a module on timelines written here:
soak samples (bench/workloads/soak --timeline) and traymalloc JSON dumps (stats_interval).

Run by ctest (tests/tools/CMakeLists.txt sets TRAY_TIMELINE_TOOL), or directly:
  python3 tests/tools/tray_timeline_test.py
"""

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

    def test_bad_input_is_refused(self):
        out = self.dir / "x.png"
        for name, lines, message in (
                ("old.jsonl", [dump_line(0, 1, with_time=False)], "without time_ms"),
                ("text.jsonl", ["not json"], "not JSON"),
                ("other.jsonl", [json.dumps({"a": 1})], "neither")):
            result = self.run_tool("--out", out, self.write(name, lines))
            self.assertEqual(result.returncode, 1, name)
            self.assertIn(message, result.stderr)
        self.assertEqual(self.run_tool("--out", self.dir / "x.jpg", "a=b").returncode, 2)


if __name__ == "__main__":
    unittest.main()
