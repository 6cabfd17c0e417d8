"""Tests of tools/bench-compare: its table from known runs, a tiny real run (multi-threaded
workloads once per --threads count), the workloads' --describe, the skip of a workload whose
program this machine lacks, its refusal of a run whose preload put the wrong malloc in place,
and the callgrind table's column for an allocator callgrind could not count.

Run by ctest (tests/bench/CMakeLists.txt), which sets BENCH_COMPARE (the runner),
BENCH_BUILD_DIR (a build with bench/workloads), TRAYMALLOC_LIB and BENCH_WORK_DIR.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import unittest
from importlib.machinery import SourceFileLoader
from pathlib import Path

RUNNER = Path(os.environ["BENCH_COMPARE"])
BUILD_DIR = Path(os.environ["BENCH_BUILD_DIR"])
TRAYMALLOC_LIB = Path(os.environ["TRAYMALLOC_LIB"])
WORK_DIR = Path(os.environ["BENCH_WORK_DIR"])
JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")


def load_runner():
    loader = SourceFileLoader("bench_compare", str(RUNNER))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def run_runner(out_dir, *arguments, lib=TRAYMALLOC_LIB, env=None):
    shutil.rmtree(out_dir, ignore_errors=True)
    return subprocess.run([str(RUNNER), "--build", str(BUILD_DIR), "--lib", str(lib),
                           "--out", str(out_dir), *arguments],
                          capture_output=True, text=True, timeout=240, env=env)


def workload_programs():
    return sorted(p for p in (BUILD_DIR / "bench" / "workloads").iterdir()
                  if p.is_file() and os.access(p, os.X_OK))


def describe(program, env=None):
    """The workload's own --describe line, as a dict."""
    result = subprocess.run([str(program), "--describe"], capture_output=True, text=True,
                            timeout=30, env=env)
    assert result.returncode == 0, result.stderr
    line = next(l for l in result.stdout.splitlines() if l.startswith("DESCRIBE "))
    return dict(item.split("=", 1) for item in line.split()[1:])


def expected_rows(thread_counts):
    """The report rows for every workload in the build that this machine can run: NAME (T thr)
    per count, or NAME."""
    rows = []
    for program in workload_programs():
        fields = describe(program)
        if "missing" in fields:
            continue
        if fields["threads"] == "yes":
            rows += [f"{program.name} ({t} thr)" for t in thread_counts]
        else:
            rows.append(program.name)
    return sorted(rows)


def table_rows(markdown, heading):
    """The data rows of the table under `heading`, as lists of cells."""
    lines = markdown.split(heading, 1)[1].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[first + 2:]:  # after the header and its rule
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


class TableFromKnownRuns(unittest.TestCase):
    def setUp(self):
        self.runner = load_runner()
        Run = self.runner.Run
        runs = []
        for rep, (tray_s, glibc_s) in enumerate([(1.0, 4.0), (3.0, 5.0), (2.0, 4.0)]):
            runs.append(Run("larson", "traymalloc", rep, seconds=tray_s, cpu_seconds=2 * tray_s,
                            peak_rss_kb=10240))
            runs.append(Run("larson", "glibc", rep, seconds=glibc_s, cpu_seconds=glibc_s,
                            peak_rss_kb=5120))
            live = {"peak_live_kb": "4096"}
            runs.append(Run("fragmentation", "traymalloc", rep, seconds=0.5, cpu_seconds=0.5,
                            peak_rss_kb=8192, fields=live))
            runs.append(Run("fragmentation", "glibc", rep, seconds=0.25, cpu_seconds=0.25,
                            peak_rss_kb=16384, fields=live))
        runs.append(Run("fragmentation", "glibc", 3, error="exit 1: check failed"))
        self.summary = self.runner.summarize(runs, ["larson", "fragmentation"],
                                             ["traymalloc", "glibc"], "traymalloc")
        meta = {"description": [("Command", "`test`")], "failures": ["fragmentation failed"]}
        self.markdown = self.runner.render_markdown(self.summary, ["traymalloc", "glibc"],
                                                    "traymalloc", meta)

    def test_medians_and_ratios(self):
        larson = self.summary["larson"]
        self.assertEqual(larson["traymalloc"]["median_seconds"], 2.0)
        self.assertEqual(larson["glibc"]["median_seconds"], 4.0)
        self.assertAlmostEqual(larson["glibc"]["seconds_ratio"], 2.0)
        self.assertAlmostEqual(larson["glibc"]["rss_ratio"], 0.5)

    def test_time_and_rss_tables(self):
        time_rows = table_rows(self.markdown, "## Wall time")
        self.assertEqual(time_rows[0], ["larson", "2.000 s", "4.000 s (2.00×)"])
        cpu_rows = table_rows(self.markdown, "## CPU time")
        self.assertEqual(cpu_rows[0], ["larson", "4.000 s", "4.000 s (1.00×)"])
        rss_rows = table_rows(self.markdown, "## Peak RSS")
        self.assertEqual(rss_rows[0], ["larson", "10.0 MiB", "5.0 MiB (0.50×)"])

    def test_a_failed_run_fails_its_cell(self):
        self.assertEqual(self.summary["fragmentation"]["glibc"], {"failed": 1})
        self.assertEqual(table_rows(self.markdown, "## Wall time")[1],
                         ["fragmentation", "0.500 s", "failed"])
        self.assertIn("## Failed runs", self.markdown)

    def test_fragmentation_ratio(self):
        rows = table_rows(self.markdown, "## fragmentation: peak RSS / peak live bytes")
        self.assertEqual(rows, [["traymalloc", "4.0 MiB", "8.0 MiB", "2.00"]])


class TinyRun(unittest.TestCase):
    """Every workload, with the default --threads (2,4,8)."""

    @classmethod
    def setUpClass(cls):
        cls.out_dir = WORK_DIR / "tiny"
        cls.result = run_runner(cls.out_dir, "--allocators", "traymalloc,glibc",
                                "--reps", "2", "--scale", "0.01")
        cls.workloads = expected_rows((2, 4, 8))

    def test_runner_succeeds_with_progress(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)
        expected_runs = 2 * 2 * len(self.workloads)
        self.assertIn(f"[{expected_runs:4}/{expected_runs}]", self.result.stderr)

    def test_json_has_every_run_checked(self):
        results = json.loads((self.out_dir / "results.json").read_text())
        self.assertEqual(len(results["runs"]), 2 * 2 * len(self.workloads))
        for run in results["runs"]:
            self.assertIsNone(run["error"])
            self.assertEqual(run["fields"]["check"], "ok")
            self.assertEqual(run["fields"]["malloc"], run["allocator"])
            self.assertGreater(run["peak_rss_kb"], 0)
            self.assertGreater(run["cpu_seconds"], 0)
        self.assertEqual(sorted(results["summary"]), self.workloads)

    def test_markdown_matches_json(self):
        results = json.loads((self.out_dir / "results.json").read_text())
        markdown = (self.out_dir / "results.md").read_text()
        rows = {row[0]: row[1:] for row in table_rows(markdown, "## Wall time")}
        self.assertEqual(sorted(rows), self.workloads)
        for workload, cells in results["summary"].items():
            tray, glibc = cells["traymalloc"], cells["glibc"]
            self.assertEqual(rows[workload][0], f"{tray['median_seconds']:.3f} s")
            ratio = glibc["median_seconds"] / tray["median_seconds"]
            self.assertEqual(rows[workload][1], f"{glibc['median_seconds']:.3f} s ({ratio:.2f}×)")

    def test_chart_is_a_png_unless_explained(self):
        markdown = (self.out_dir / "results.md").read_text()
        if "Chart: not drawn" in markdown:
            self.assertFalse((self.out_dir / "chart.png").exists())
        else:
            self.assertEqual((self.out_dir / "chart.png").read_bytes()[:8], b"\x89PNG\r\n\x1a\n")


class Describe(unittest.TestCase):
    def test_every_workload_says_whether_it_is_threaded(self):
        programs = {p.name: p for p in workload_programs()}
        for name, program in programs.items():
            fields = describe(program)
            self.assertEqual(fields["workload"], name)
            self.assertIn(fields["threads"], ("yes", "no"))
        # The five mimalloc-bench-style workloads: all threaded but malloc_large.
        for name in ("larson_server", "xmalloc_test", "rptest", "mstress"):
            self.assertEqual(describe(programs[name])["threads"], "yes", name)
        self.assertEqual(describe(programs["malloc_large"])["threads"], "no")

    def test_a_single_threaded_workload_refuses_threads(self):
        program = BUILD_DIR / "bench" / "workloads" / "particles"
        result = subprocess.run([str(program), "--threads", "2", "--scale", "0.01"],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 2, result.stdout)

    def test_thread_list_parsing(self):
        runner = load_runner()
        self.assertEqual(runner.parse_thread_list("2,4"), [2, 4])
        self.assertEqual(runner.parse_thread_list("3, 1,3"), [3, 1])
        for bad in ("0", "two", ",", "2,-1"):
            with self.assertRaises(SystemExit, msg=bad):
                runner.parse_thread_list(bad)


class ThreadCounts(unittest.TestCase):
    """--threads: a row per count for a threaded workload, passed on as --threads T."""

    @classmethod
    def setUpClass(cls):
        cls.out_dir = WORK_DIR / "threads"
        cls.result = run_runner(cls.out_dir, "--allocators", "traymalloc,glibc", "--reps", "1",
                                "--scale", "0.01", "--workloads", "larson_server,particles",
                                "--threads", "1,3")

    def test_rows_and_thread_counts(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)
        results = json.loads((self.out_dir / "results.json").read_text())
        self.assertEqual(results["settings"]["threads"], [1, 3])
        self.assertEqual(list(results["summary"]),
                         ["larson_server (1 thr)", "larson_server (3 thr)", "particles"])
        self.assertEqual(len(results["runs"]), 2 * 3)
        for run in results["runs"]:
            self.assertIsNone(run["error"])
            if run["program"] == "larson_server":
                self.assertEqual(run["workload"], f"larson_server ({run['threads']} thr)")
                self.assertEqual(run["fields"]["threads"], str(run["threads"]))
            else:
                self.assertEqual(run["workload"], "particles")
                self.assertIsNone(run["threads"])
        markdown = (self.out_dir / "results.md").read_text()
        self.assertEqual([row[0] for row in table_rows(markdown, "## Wall time")],
                         ["larson_server (1 thr)", "larson_server (3 thr)", "particles"])


class MissingProgram(unittest.TestCase):
    """A workload that names what this machine lacks is left out of the run, and said so."""

    def test_ruby_stress_without_ruby_is_skipped(self):
        env = dict(os.environ, RUBY="/nonexistent/ruby")
        program = BUILD_DIR / "bench" / "workloads" / "ruby_stress"
        self.assertEqual(describe(program, env).get("missing"), "ruby")
        out_dir = WORK_DIR / "missing"
        result = run_runner(out_dir, "--allocators", "traymalloc", "--reps", "1", "--scale",
                            "0.01", "--workloads", "ruby_stress,particles", env=env)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("skipping workload ruby_stress: this machine has no ruby", result.stderr)
        results = json.loads((out_dir / "results.json").read_text())
        self.assertEqual(list(results["summary"]), ["particles"])
        self.assertIn("workload ruby_stress", results["skipped"])
        self.assertIn("Skipped workload ruby_stress", (out_dir / "results.md").read_text())


@unittest.skipUnless(shutil.which("valgrind"), "needs valgrind")
class CallgrindNotCounted(unittest.TestCase):
    """--callgrind: an allocator callgrind cannot run keeps its column, marked, and the others
    are counted all the same."""

    def test_an_allocator_that_never_ran_is_marked_not_counted(self):
        # Not a shared object: the dynamic loader ignores it, so glibc's malloc runs in its
        # place and the check that the preload ran under callgrind must catch it.
        bogus = WORK_DIR / "not_a_library.so"
        WORK_DIR.mkdir(parents=True, exist_ok=True)
        bogus.write_text("not an ELF file\n")
        out_dir = WORK_DIR / "callgrind_not_counted"
        result = run_runner(out_dir, "--callgrind", "--allocators", "glibc", "--baseline",
                            "glibc", "--allocator", f"bogus={bogus}")
        self.assertEqual(result.returncode, 1, result.stderr)
        counts = json.loads((out_dir / "callgrind.json").read_text())
        self.assertIn("never ran under callgrind", counts["not_counted"]["bogus"])
        rows = table_rows((out_dir / "callgrind.md").read_text(), "# Instructions per")
        self.assertEqual(len(rows), len(counts["instructions_per_pair"]))
        for row in rows:
            self.assertEqual(row[2], "not counted", row)
            self.assertGreater(float(row[1]), 10, row)  # glibc's count: a loop and a pair
        self.assertIn("Not counted bogus", (out_dir / "callgrind.md").read_text())


@unittest.skipUnless(JEMALLOC.is_file(), "needs Debian's libjemalloc2")
class WrongPreload(unittest.TestCase):
    def test_a_run_under_the_wrong_malloc_fails(self):
        out_dir = WORK_DIR / "wrong_preload"
        result = run_runner(out_dir, "--allocators", "traymalloc", "--workloads", "particles",
                            "--reps", "1", "--scale", "0.01", lib=JEMALLOC)
        self.assertEqual(result.returncode, 1, result.stderr)
        markdown = (out_dir / "results.md").read_text()
        self.assertIn("expected malloc traymalloc but jemalloc is in use", markdown)


@unittest.skipUnless(JEMALLOC.is_file(), "needs Debian's libjemalloc2")
class GivenAllocator(unittest.TestCase):
    """--allocator NAME=PATH.so: a column of its own, checked by the library's path."""

    def test_a_given_library_runs_in_its_own_column(self):
        out_dir = WORK_DIR / "given"
        result = run_runner(out_dir, "--allocators", "traymalloc", "--allocator",
                            f"jemalloc_local={JEMALLOC}", "--workloads", "particles",
                            "--reps", "1", "--scale", "0.01")
        self.assertEqual(result.returncode, 0, result.stderr)
        results = json.loads((out_dir / "results.json").read_text())
        self.assertEqual(results["allocators"]["jemalloc_local"], str(JEMALLOC))
        runs = [r for r in results["runs"] if r["allocator"] == "jemalloc_local"]
        self.assertEqual(len(runs), 1)
        self.assertIsNone(runs[0]["error"])
        self.assertEqual(runs[0]["fields"]["malloc"], "jemalloc")
        self.assertIn("jemalloc_local", (out_dir / "results.md").read_text())

    def test_a_given_library_that_did_not_define_malloc_fails_the_run(self):
        # The path names traymalloc's library, but jemalloc's is preloaded in its place: the
        # workload's check by path must see it.
        program = BUILD_DIR / "bench" / "workloads" / "particles"
        env = dict(os.environ, LD_PRELOAD=str(JEMALLOC))
        result = subprocess.run([str(program), "--scale", "0.01", "--expect-malloc",
                                 str(TRAYMALLOC_LIB)], capture_output=True, text=True,
                                env=env, timeout=60)
        self.assertEqual(result.returncode, 3, result.stdout)
        self.assertIn(f"expected malloc {TRAYMALLOC_LIB}", result.stderr)

    def test_bad_arguments_are_refused(self):
        for argument in ("jemalloc", "=x.so", "glibc=/lib/x.so", "a b=/x.so",
                         "missing=/nonexistent/lib.so"):
            result = run_runner(WORK_DIR / "given_bad", "--allocator", argument,
                                "--workloads", "particles", "--reps", "1")
            self.assertNotEqual(result.returncode, 0, argument)
            self.assertIn("--allocator", result.stderr, argument)


if __name__ == "__main__":
    unittest.main(verbosity=2)
