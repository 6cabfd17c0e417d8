"""Tests of traymalloc's statistics as a preloaded program sees them: the JSON dumps of
TRAY_OPTIONS (at exit, on a signal, to a stats_file with %p), glibc's malloc_stats(),
malloc_info() and mallinfo2(), all compared with one another and with what the program did.

The programs: stats_probe (stats_probe.c, known allocations) and a Python interpreter with
PYTHONMALLOC=malloc doing real work. The Python run writes its dumps to TRAY_STATS_REAL_DUMP
when that is set, for tests/tools to show them with tools/tray-stats.

Usage: python3 tests/stats/stats_test.py LIBTRAYMALLOC STATS_PROBE [unittest options]
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ElementTree
from pathlib import Path

LIBRARY = None  # set from the command line
PROBE = None
FORMAT_VERSION = 2
# Dumps print ratios with three decimals.
RATIO_STEP = 0.001 + 1e-9

SIGNAL_OPTIONS = ("stats=1", "stats_format=json", "stats_signal=SIGUSR1")


def run_preloaded(command, options, env=None):
    environment = dict(os.environ if env is None else env, LD_PRELOAD=str(LIBRARY),
                       TRAY_OPTIONS=",".join(options))
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                            env=environment, timeout=240)
    if result.returncode != 0:
        raise AssertionError(f"{command} exited with {result.returncode}:\n{result.stderr}")
    return result


def read_dumps(path):
    """Every dump of a JSON Lines file; a line that is not JSON fails with its number."""
    dumps = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        try:
            dumps.append(json.loads(line))
        except json.JSONDecodeError as error:
            around = line[max(error.pos - 100, 0):error.pos + 100]
            raise AssertionError(f"{path} line {number} is not JSON ({error}), near: {around}")
    return dumps


def probe_facts(stdout):
    """The probe's "name value" lines (those with more words are the caller's), up to the XML
    of malloc_info."""
    pairs = (line.split() for line in stdout.split("<malloc", 1)[0].splitlines())
    return {words[0]: int(words[1]) for words in pairs if len(words) == 2}


def class_for(dump, size):
    """The class malloc(size) uses: the smallest whose blocks hold size bytes (None: large)."""
    return next((c for c in dump["classes"] if c["block_bytes"] >= size), None)


def free_blocks(size_class):
    return size_class["pages"] * size_class["blocks_per_page"] - size_class["live_blocks"]


class DumpChecks(unittest.TestCase):
    """What every dump must satisfy, and what only a dump of a quiet process must."""

    def check_dump(self, dump, quiet=True):
        self.assertEqual(dump["traymalloc_stats"], FORMAT_VERSION)
        self.assertIn(dump["reason"], ("exit", "signal", "api", "malloc_stats"))
        self.assertEqual([c["class"] for c in dump["classes"]], list(range(len(dump["classes"]))))
        sizes = [c["block_bytes"] for c in dump["classes"]]
        self.assertEqual(sizes, sorted(set(sizes)))
        for c in dump["classes"]:
            with self.subTest(block_bytes=c["block_bytes"], reason=dump["reason"]):
                self.check_class(c, quiet)
        large = dump["large"]
        self.assertEqual(large["allocations"] - large["frees"], large["live_blocks"])
        self.assertLessEqual(large["live_bytes"], large["peak_bytes"])
        self.assertEqual(large["cached_blocks"] == 0, large["cached_bytes"] == 0)
        if not quiet:
            return
        self.assertLessEqual(large["live_bytes"] + large["cached_bytes"], large["mapped_bytes"])
        process = dump["process"]
        reserved = sum(c["reserved_bytes"] for c in dump["classes"])
        self.assertLessEqual(reserved, process["committed_bytes"])
        self.assertLessEqual(process["committed_bytes"], process["mapped_bytes"])
        self.assertLessEqual(reserved + large["mapped_bytes"], process["mapped_bytes"])
        self.assertLessEqual(process["metadata_bytes"], process["committed_bytes"])
        self.assertGreater(process["resident_bytes"], 0)
        self.assertGreaterEqual(process["heaps_created"], process["threads_alive"])

    def check_class(self, c, quiet):
        capacity = c["pages"] * c["blocks_per_page"]
        handed_out = c["allocations"] * c["block_bytes"]
        # Running threads may make frees overtake allocations for a moment: shown as 0 live.
        self.assertEqual(c["live_blocks"], max(c["allocations"] - c["frees"], 0))
        if quiet:
            self.assertGreaterEqual(c["allocations"], c["frees"])
            self.assertLessEqual(c["live_blocks"], capacity)
            self.assertLessEqual(c["pages"], c["peak_pages"])
            self.assertLessEqual(c["requested_bytes"], handed_out)
        self.assertEqual(c["live_bytes"], c["live_blocks"] * c["block_bytes"])
        self.assertEqual(c["reserved_bytes"], c["pages"] * c["page_bytes"])
        self.assertLessEqual(c["blocks_per_page"] * c["block_bytes"], c["page_bytes"])
        self.assertGreaterEqual(c["peak_live_blocks"], c["live_blocks"])
        utilization = c["live_blocks"] / capacity if capacity else 0.0
        self.assertAlmostEqual(c["utilization"], utilization, delta=RATIO_STEP)
        waste = max(0.0, 1 - c["requested_bytes"] / handed_out) if handed_out else 0.0
        self.assertAlmostEqual(c["internal_waste"], waste, delta=RATIO_STEP)

    def check_counters_grow(self, earlier, later):
        for a, b in zip(earlier["classes"], later["classes"]):
            self.assertLessEqual(a["allocations"], b["allocations"], a["block_bytes"])
            self.assertLessEqual(a["frees"], b["frees"], a["block_bytes"])
            self.assertLessEqual(a["peak_live_blocks"], b["peak_live_blocks"], a["block_bytes"])


# --- the text dump --------------------------------------------------------------------------
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
AMOUNT = r"(\d+(?:\.\d)?) (B|KiB|MiB|GiB|TiB)"
TEXT_ROW = re.compile(rf"^  +{AMOUNT} +(\d+) +(\d+) +(\d+) +(\d+) +(\d+) +(\d+) +{AMOUNT} +"
                      rf"{AMOUNT} +(\d+\.\d)% +(\d+\.\d)%$")
TEXT_ROW_FIELDS = ("blocks_per_page", "live_blocks", "peak_live_blocks", "allocations", "frees",
                   "pages")


def amount(number, unit):
    return float(number) * UNITS[unit]


def amount_range(number, unit):
    """The bytes that a human amount such as "109.4 KiB" can stand for: [low, high)."""
    low = amount(number, unit)
    return low, low + (UNITS[unit] / 10 if "." in number else 1)


def parse_text_dump(text):
    """The header's pid and reason, the table's rows by block size, the summary lines' text."""
    lines = text.split("Total (incl. mmap):\n", 1)[0].splitlines()  # glibc's totals apart
    header = re.fullmatch(r"traymalloc: stats: pid=(\d+) reason=(\w+)", lines[0])
    if header is None or not lines[1].split()[:2] == ["class", "blocks/page"]:
        raise AssertionError(f"not a text dump:\n{text}")
    rows, summary = {}, {}
    for line in lines[2:]:
        if match := TEXT_ROW.match(line):
            cells = match.groups()
            row = dict(zip(TEXT_ROW_FIELDS, map(int, cells[2:8])))
            row["live_bytes"] = amount_range(*cells[8:10])
            row["reserved_bytes"] = amount_range(*cells[10:12])
            row["utilization"] = float(cells[12]) / 100
            rows[int(amount(*cells[0:2]))] = row
        elif match := re.match(r"  (small|large|memory|huge pages|threads|os calls): (.*)$", line):
            summary[match[1]] = match[2]
        else:
            raise AssertionError(f"unexpected line in the text dump: {line!r}")
    return int(header[1]), header[2], rows, summary


class HoldTest(DumpChecks):
    """N blocks held while malloc_stats, a signal dump, mallinfo2 and malloc_info report them:
    nothing allocates between the four, so they must agree exactly."""

    CASES = ((1000, 100), (300, 48), (200, 5000), (64, 131072), (40, 300_000), (5, 3_000_000))

    def test_every_report_shows_the_held_blocks(self):
        for count, size in self.CASES:
            with self.subTest(count=count, size=size), tempfile.TemporaryDirectory() as folder:
                dump_path = Path(folder) / "stats.jsonl"
                result = run_preloaded([PROBE, "hold", count, size],
                                       (*SIGNAL_OPTIONS, f"stats_file={dump_path}"))
                facts = probe_facts(result.stdout)
                dumps = read_dumps(dump_path)
                self.assertEqual([d["reason"] for d in dumps], ["signal", "exit"])
                for dump in dumps:
                    self.assertEqual(dump["pid"], facts["pid"])
                    self.check_dump(dump)
                held = dumps[0]
                self.check_held_blocks(held, facts, count, size)
                self.check_mallinfo2(held, facts)
                self.check_malloc_info(held, facts, result.stdout)
                self.check_malloc_stats(held, result.stderr)

    def check_held_blocks(self, dump, facts, count, size):
        size_class = class_for(dump, size)
        if size_class is None:
            self.assertGreaterEqual(dump["large"]["live_blocks"], count)
            self.assertGreaterEqual(dump["large"]["live_bytes"], count * size)
            self.assertGreaterEqual(facts["hblks"], count)
            self.assertGreaterEqual(facts["hblkhd"], count * size)
        else:
            # A heap serves its first few requests of a big class (above 128 KiB) with large
            # blocks, until it uses the class enough for a page of it.
            big = size > 128 * 1024
            large_blocks = dump["large"]["live_blocks"] if big else 0
            large_bytes = facts["hblkhd"] if big else 0
            self.assertGreaterEqual(size_class["live_blocks"] + large_blocks, count)
            self.assertGreaterEqual(facts["uordblks"] + large_bytes, count * size)

    def check_mallinfo2(self, dump, facts):
        classes = dump["classes"]
        self.assertEqual(facts["arena"], sum(c["reserved_bytes"] for c in classes))
        self.assertEqual(facts["uordblks"], sum(c["live_bytes"] for c in classes))
        self.assertEqual(facts["ordblks"], sum(free_blocks(c) for c in classes))
        self.assertEqual(facts["fordblks"], facts["arena"] - facts["uordblks"])
        self.assertEqual(facts["hblks"], dump["large"]["live_blocks"])
        self.assertEqual(facts["hblkhd"], dump["large"]["live_bytes"])

    def check_malloc_info(self, dump, facts, stdout):
        root = ElementTree.fromstring(stdout[stdout.index("<malloc"):])
        self.assertEqual(root.tag, "malloc")
        sizes = root.findall("./heap/sizes/size")
        self.assertTrue(sizes, "malloc_info lists no <size>")
        by_block_size = {c["block_bytes"]: c for c in dump["classes"]}
        for element in sizes:
            low, high = int(element.get("from")), int(element.get("to"))
            count, total = int(element.get("count")), int(element.get("total"))
            self.assertLessEqual(low, high)
            self.assertEqual(count, free_blocks(by_block_size[high]), f"size to={high}")
            self.assertEqual(total, count * high)
        rest = root.find("./total[@type='rest']")
        self.assertEqual(int(rest.get("count")), facts["ordblks"])
        self.assertEqual(int(rest.get("size")), sum(int(e.get("total")) for e in sizes))
        mapped = root.find("./total[@type='mmap']")
        self.assertEqual(int(mapped.get("count")), facts["hblks"])
        self.assertEqual(int(mapped.get("size")), facts["hblkhd"])
        current = root.find("./system[@type='current']")
        self.assertEqual(int(current.get("size")), dump["process"]["committed_bytes"])
        address_space = root.find("./aspace[@type='total']")
        self.assertEqual(int(address_space.get("size")), dump["process"]["mapped_bytes"])

    def check_malloc_stats(self, dump, stderr):
        pid, reason, rows, summary = parse_text_dump(stderr)
        self.assertEqual((pid, reason), (dump["pid"], "malloc_stats"))
        used = {c["block_bytes"]: c for c in dump["classes"] if c["allocations"] or c["pages"]}
        self.assertEqual(sorted(rows), sorted(used))
        for block_bytes, row in rows.items():
            c = used[block_bytes]
            for name in TEXT_ROW_FIELDS:
                self.assertEqual(row[name], c[name], f"{name} of {block_bytes} B")
            # Human units with one decimal, cut off rather than rounded.
            for name in ("live_bytes", "reserved_bytes"):
                low, high = row[name]
                self.assertTrue(low - 1e-6 <= c[name] < high, f"{name} {c[name]} in {row[name]}")
            self.assertAlmostEqual(row["utilization"], c["utilization"], delta=0.001)
        small = re.match(r"(\d+) live blocks \(.*\) in (\d+) pages .*; (\d+) allocations, "
                         r"(\d+) frees$", summary["small"])
        self.assertIsNotNone(small, summary["small"])
        sums = [sum(c[k] for c in dump["classes"])
                for k in ("live_blocks", "pages", "allocations", "frees")]
        self.assertEqual([int(n) for n in small.groups()], sums)
        large = dump["large"]
        self.assertRegex(summary["large"], rf"^{large['live_blocks']} live blocks .*; "
                                           rf"{large['allocations']} allocations, "
                                           rf"{large['frees']} frees;")
        self.assertRegex(summary["memory"], rf", segments {dump['process']['segments']}, unit map "
                                            rf"[0-9.]+ [KMG]iB of address space$")
        self.assertGreater(dump["process"]["unit_map_bytes"], 0)
        process = dump["process"]
        self.assertEqual(summary["threads"],
                         f"alive {process['threads_alive']}, exited {process['threads_exited']},"
                         f" heaps {process['heaps_created']}; remote frees "
                         f"{process['remote_frees']} ({process['reused_blocks']} blocks reused by the"
                         f" thread that freed them), foreign frees {process['foreign_frees']},"
                         f" debug errors {process['debug_errors']}")
        huge = dump["huge_pages"]
        self.assertRegex(summary["huge pages"], rf"^thp={huge['thp']} \(kernel: {huge['kernel']}\), "
                                                rf"AnonHugePages [0-9.]+ (B|[KMG]iB) \(whole process\)$")
        self.assertEqual(summary["os calls"],
                         ", ".join(f"{name} {count}" for name, count in dump["os_calls"].items()))
        # glibc's totals close the dump, for scripts written against glibc's malloc_stats.
        totals = dict(re.findall(r"^(system bytes|in use bytes|max mmap regions|max mmap bytes)"
                                 r" += +(\d+)$", stderr.split("Total (incl. mmap):\n", 1)[-1],
                                 re.MULTILINE))
        live = sum(c["live_blocks"] * c["block_bytes"] for c in dump["classes"])
        self.assertEqual({k: int(v) for k, v in totals.items()},
                         {"system bytes": process["committed_bytes"],
                          "in use bytes": live + large["live_bytes"],
                          "max mmap regions": large["live_blocks"],
                          "max mmap bytes": large["peak_bytes"]})


class SignalTest(DumpChecks):
    def test_two_signal_dumps_then_one_at_exit_in_a_file_named_by_pid(self):
        for spelling in ("SIGUSR1", "USR1", str(int(signal.SIGUSR1))):
            with self.subTest(stats_signal=spelling), tempfile.TemporaryDirectory() as folder:
                options = ("stats=1", "stats_format=json", f"stats_signal={spelling}",
                           f"stats_file={folder}/run-%p.jsonl")
                facts = probe_facts(run_preloaded([PROBE, "signal"], options).stdout)
                self.assertEqual(os.listdir(folder), [f"run-{facts['pid']}.jsonl"])
                dumps = read_dumps(Path(folder) / f"run-{facts['pid']}.jsonl")
                self.assertEqual([d["reason"] for d in dumps], ["signal", "signal", "exit"])
                for dump in dumps:
                    self.assertEqual(dump["pid"], facts["pid"])
                    self.check_dump(dump)
                self.check_counters_grow(dumps[0], dumps[1])
                self.check_counters_grow(dumps[1], dumps[2])
                # The probe's blocks have a size class of their own.
                first, second, at_exit = (class_for(d, facts["size"]) for d in dumps)
                self.assertEqual(first["live_blocks"], facts["first"])
                self.assertEqual(second["allocations"] - first["allocations"], facts["added"])
                self.assertEqual(second["live_blocks"], facts["first"] + facts["added"])
                self.assertEqual(at_exit["live_blocks"], facts["kept"])

    def test_percent_percent_is_a_percent_sign(self):
        with tempfile.TemporaryDirectory() as folder:
            facts = probe_facts(run_preloaded(
                [PROBE, "signal"],
                (*SIGNAL_OPTIONS, f"stats_file={folder}/100%%-%p")).stdout)
            self.assertEqual(os.listdir(folder), [f"100%-{facts['pid']}"])


class ThreadsTest(DumpChecks):
    def test_counts_of_four_threads_that_free_each_others_blocks(self):
        with tempfile.TemporaryDirectory() as folder:
            dump_path = Path(folder) / "threads.jsonl"
            result = run_preloaded([PROBE, "threads"],
                                   ("stats=1", "stats_format=json", f"stats_file={dump_path}"))
            dumps = read_dumps(dump_path)
        self.assertEqual([d["reason"] for d in dumps], ["exit"])
        dump = dumps[0]
        self.check_dump(dump)
        facts = probe_facts(result.stdout)
        self.assertEqual(dump["pid"], facts["pid"])
        process = dump["process"]
        self.assertGreaterEqual(process["remote_frees"], facts["remote_frees"])
        self.assertGreaterEqual(process["threads_exited"], facts["threads"])
        self.assertEqual(process["threads_alive"], 1)
        self.assertGreaterEqual(process["heaps_created"], facts["threads"] + 1)
        # Each thread's blocks have a size class of their own: its counts are exact.
        for line in result.stdout.splitlines():
            if not line.startswith("thread_blocks "):
                continue
            _, size, *pairs = line.split()
            expected = dict(zip(pairs[0::2], map(int, pairs[1::2])))
            c = class_for(dump, int(size))
            self.assertEqual({"allocations": c["allocations"], "frees": c["frees"],
                              "live": c["live_blocks"]}, expected, f"{size} B blocks")


class SignalStormTest(DumpChecks):
    """SIGUSR1 sent to four threads at once while they allocate and free: no crash, and every
    dump whole and on its own line."""

    def test_concurrent_signal_dumps_from_allocating_threads(self):
        with tempfile.TemporaryDirectory() as folder:
            dump_path = Path(folder) / "storm.jsonl"
            result = run_preloaded([PROBE, "signal-threads", 500],
                                   (*SIGNAL_OPTIONS, f"stats_file={dump_path}"))
            facts = probe_facts(result.stdout)
            dumps = read_dumps(dump_path)
        reasons = [d["reason"] for d in dumps]
        self.assertEqual(reasons[-1], "exit")
        self.assertEqual(set(reasons[:-1]), {"signal"})
        # Signals sent to a thread that is still in its previous dump may merge into one.
        self.assertLessEqual(len(dumps) - 1, facts["signals"])
        for dump in dumps:
            self.assertEqual(dump["pid"], facts["pid"])
            self.check_dump(dump, quiet=dump["reason"] == "exit")


# Three threads build tables that the main thread frees (remote frees); the main thread asks
# for a dump with SIGUSR1 while they run.
PYTHON_WORKLOAD = r"""
import json, os, signal, threading
STRINGS_PER_THREAD = 60_000
results = {}
def build(seed):
    table = {f"key-{seed}-{i}": [i, str(i * i)] for i in range(STRINGS_PER_THREAD)}
    results[seed] = json.dumps(table)
    results[seed, "table"] = table
threads = [threading.Thread(target=build, args=(seed,)) for seed in range(3)]
for t in threads: t.start()
os.kill(os.getpid(), signal.SIGUSR1)
for t in threads: t.join()
total = sum(len(results[seed]) for seed in range(3))
results.clear()
print(os.getpid(), total)
"""


class RealProgramTest(DumpChecks):
    def test_python_dumps_reconcile(self):
        with tempfile.TemporaryDirectory() as folder:
            dump_path = Path(os.environ.get("TRAY_STATS_REAL_DUMP") or Path(folder) / "py.jsonl")
            dump_path.unlink(missing_ok=True)  # stats_file appends
            env = dict(os.environ, PYTHONMALLOC="malloc")
            result = run_preloaded([sys.executable, "-c", PYTHON_WORKLOAD],
                                   (*SIGNAL_OPTIONS, f"stats_file={dump_path}"), env=env)
            pid, text_length = map(int, result.stdout.split())
            self.assertGreater(text_length, 3 * 60_000 * 20)
            dumps = read_dumps(dump_path)
        self.assertEqual([(d["reason"], d["pid"]) for d in dumps], [("signal", pid), ("exit", pid)])
        during, at_exit = dumps
        self.check_dump(during, quiet=False)  # taken while the threads allocate
        self.check_dump(at_exit)
        self.check_counters_grow(during, at_exit)
        process = at_exit["process"]
        self.assertGreaterEqual(process["threads_exited"], 3)
        # The main thread freed the tables, one block per string and list at least.
        self.assertGreaterEqual(process["remote_frees"], 3 * 60_000)
        self.assertGreater(sum(c["allocations"] for c in at_exit["classes"]), 3 * 2 * 60_000)
        self.assertEqual(process["foreign_frees"], 0)
        self.assertEqual(process["debug_errors"], 0)


class OnlyExeTest(DumpChecks):
    """only_exe: a shell that passes TRAY_OPTIONS on writes no dump; the program named does."""

    def test_only_the_named_executable_dumps(self):
        python = Path(sys.executable).resolve()  # /proc/self/exe names the file, links resolved
        for pattern, dumps_expected in ((python.name, 1), (python.name[:4] + "*", 1),
                                        ("nothing_so_named", 0)):
            with self.subTest(only_exe=pattern), tempfile.TemporaryDirectory() as folder:
                options = ("stats=1", "stats_format=json", f"stats_file={folder}/d.%p.jsonl",
                           f"only_exe={pattern}")
                # sh starts python as a child: both read the same TRAY_OPTIONS.
                run_preloaded(["/bin/sh", "-c", f"{python} -c pass; true"], options)
                files = list(Path(folder).glob("d.*.jsonl"))
                self.assertEqual(len(files), dumps_expected, [f.name for f in files])


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(f"usage: {sys.argv[0]} LIBTRAYMALLOC STATS_PROBE [unittest options]")
    LIBRARY, PROBE = (Path(p).resolve() for p in sys.argv[1:3])
    unittest.main(argv=[sys.argv[0], *sys.argv[3:]])
