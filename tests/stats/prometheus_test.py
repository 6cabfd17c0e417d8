"""Tests of stats_format=prometheus as a preloaded program writes it: the file parses with a
strict reader of Prometheus's text exposition format 0.0.4, has every metric with the labels pid
and exe and numbers that agree with each other and with what the program did, and is replaced
whole: a reader that opens it in a tight loop while dumps come back to back (stats_interval,
then stats_signal) never finds it missing, cut short or holding two dumps.

Usage: python3 tests/stats/prometheus_test.py LIBTRAYMALLOC STATS_PROBE [unittest options]
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

LIBRARY = None  # set from the command line
PROBE = None

# Every family and its type: a family added to the dump is added here, and to docs/GUIDE.md.
FAMILIES = {
    "traymalloc_build_info": "gauge",
    "traymalloc_mapped_bytes": "gauge",
    "traymalloc_committed_bytes": "gauge",
    "traymalloc_resident_bytes": "gauge",
    "traymalloc_metadata_bytes": "gauge",
    "traymalloc_segments": "gauge",
    "traymalloc_released_bytes_total": "counter",
    "traymalloc_memory_limit_bytes": "gauge",
    "traymalloc_memory_limit_reached_total": "counter",
    "traymalloc_memory_limit_failures_total": "counter",
    "traymalloc_memory_limit_released_bytes_total": "counter",
    "traymalloc_class_live_bytes": "gauge",
    "traymalloc_class_live_blocks": "gauge",
    "traymalloc_class_reserved_bytes": "gauge",
    "traymalloc_class_allocations_total": "counter",
    "traymalloc_class_frees_total": "counter",
    "traymalloc_large_live_blocks": "gauge",
    "traymalloc_large_live_bytes": "gauge",
    "traymalloc_large_peak_bytes": "gauge",
    "traymalloc_large_mapped_bytes": "gauge",
    "traymalloc_large_cached_bytes": "gauge",
    "traymalloc_large_allocations_total": "counter",
    "traymalloc_large_frees_total": "counter",
    "traymalloc_threads": "gauge",
    "traymalloc_threads_exited_total": "counter",
    "traymalloc_heaps": "gauge",
    "traymalloc_remote_frees_total": "counter",
    "traymalloc_reused_blocks_total": "counter",
    "traymalloc_foreign_frees_total": "counter",
    "traymalloc_debug_errors_total": "counter",
    "traymalloc_os_calls_total": "counter",
}
CLASS_FAMILIES = [name for name in FAMILIES if name.startswith("traymalloc_class_")]
OS_CALLS = ("mmap", "munmap", "madvise", "mremap", "mprotect")
# The line a whole file ends with, whatever the numbers.
LAST_LINE = re.compile(rb'traymalloc_os_calls_total\{[^\n]*,call="mprotect"\} \d+\n\Z')

# --- a strict reader of the text exposition format 0.0.4 ------------------------------------
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# What Go's strconv.ParseFloat reads, less the forms no exporter writes (hex, underscores).
FLOAT = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|Inf|NaN)")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
LABEL_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
HELP_ESCAPES = {"\\": "\\", "n": "\n"}


class FormatError(AssertionError):
    pass


def unescape(text, escapes, where):
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            if i + 1 == len(text) or text[i + 1] not in escapes:
                raise FormatError(f"{where}: bad escape {text[i:i + 2]!r}")
            out.append(escapes[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_sample(line, where):
    """(name, {label: value}, value) of a sample line; FormatError if it is not one."""
    match = METRIC_NAME.match(line)
    if match is None:
        raise FormatError(f"{where}: no metric name")
    name, i, labels = match.group(), match.end(), {}
    try:
        if line[i] == "{":
            i += 1
            while line[i] != "}":
                match = LABEL_NAME.match(line, i)
                if match is None:
                    raise FormatError(f"{where}: bad label name at column {i}")
                label = match.group()
                if label.startswith("__"):
                    raise FormatError(f"{where}: label name {label} is reserved")
                if label in labels:
                    raise FormatError(f"{where}: label {label} twice")
                i = match.end()
                if line[i:i + 2] != '="':
                    raise FormatError(f"{where}: no =\" after label {label}")
                i += 2
                start = i
                while line[i] != '"':
                    i += 2 if line[i] == "\\" else 1
                labels[label] = unescape(line[start:i], LABEL_ESCAPES, where)
                i += 1
                if line[i] == ",":
                    i += 1
                    if line[i] == "}":
                        raise FormatError(f"{where}: comma before }}")
                elif line[i] != "}":
                    raise FormatError(f"{where}: {line[i]!r} after a label value")
            i += 1
        if line[i] != " ":
            raise FormatError(f"{where}: no blank before the value")
    except IndexError:
        raise FormatError(f"{where}: the line ends inside the sample") from None
    value = line[i + 1:]
    if " " in value:  # a timestamp: node_exporter's textfile collector refuses them
        raise FormatError(f"{where}: a timestamp, or blanks, after the value: {value!r}")
    if not FLOAT.fullmatch(value):
        raise FormatError(f"{where}: value {value!r} is not a float")
    return name, labels, float(value)


def parse_exposition(text):
    """{family: {"type", "help", "samples": [(labels, value)]}} of a whole file, in order.
    Every line must be a HELP line, then the TYPE line of the same family, then that family's
    samples; a family appears once, with at least one sample, and no series twice."""
    if not text.endswith("\n"):
        raise FormatError("the file does not end with a line feed")
    families, series, family = {}, set(), None
    expect_type = False
    for number, line in enumerate(text[:-1].split("\n"), 1):
        where = f"line {number} ({line[:120]!r})"
        if line.startswith("#"):
            match = re.fullmatch(r"# (HELP|TYPE) (\S+) (.*)", line)
            if match is None:
                raise FormatError(f"{where}: a comment other than HELP and TYPE")
            keyword, name, rest = match.groups()
            if not METRIC_NAME.fullmatch(name):
                raise FormatError(f"{where}: bad metric name {name!r}")
            if keyword == "HELP":
                if expect_type:
                    raise FormatError(f"{where}: HELP where the TYPE of {family} belongs")
                if family is not None and not families[family]["samples"]:
                    raise FormatError(f"{where}: family {family} has no sample")
                if name in families:
                    raise FormatError(f"{where}: family {name} again (split or repeated)")
                if not rest:
                    raise FormatError(f"{where}: empty HELP")
                family = name
                families[name] = {"help": unescape(rest, HELP_ESCAPES, where), "samples": []}
                expect_type = True
            else:
                if not expect_type or name != family:
                    raise FormatError(f"{where}: TYPE not right after the HELP of its family")
                if rest not in TYPES:
                    raise FormatError(f"{where}: unknown type {rest!r}")
                families[name]["type"] = rest
                expect_type = False
            continue
        if expect_type or family is None:
            raise FormatError(f"{where}: a sample before its family's HELP and TYPE")
        name, labels, value = parse_sample(line, where)
        if name != family:
            raise FormatError(f"{where}: sample of {name} inside family {family}")
        key = (name, frozenset(labels.items()))
        if key in series:
            raise FormatError(f"{where}: series repeated")
        series.add(key)
        families[family]["samples"].append((labels, value))
    if expect_type or family is None or not families[family]["samples"]:
        raise FormatError(f"the file ends inside family {family}")
    return families


# --- what traymalloc's file must hold ----------------------------------------------------------
def run_preloaded(command, options, **kwargs):
    environment = dict(os.environ, LD_PRELOAD=str(LIBRARY), TRAY_OPTIONS=",".join(options))
    return subprocess.run([c if isinstance(c, bytes) else str(c) for c in command],
                          capture_output=True, text=True, env=environment, timeout=240,
                          check=True, **kwargs)


def probe_facts(stdout):
    pairs = (line.split() for line in stdout.splitlines())
    return {words[0]: int(words[1]) for words in pairs if len(words) == 2}


def single(families, name):
    (labels, value), = families[name]["samples"]
    return value


def by_class(families, name):
    """{block size: value} of a per-class family."""
    return {int(labels["size_class"]): value for labels, value in families[name]["samples"]}


class ExpositionChecks(unittest.TestCase):
    def check_file(self, text, pid, exe, quiet=True):
        """Parses text and checks what every dump holds; the families."""
        families = parse_exposition(text)
        self.assertEqual({name: f["type"] for name, f in families.items()}, FAMILIES)
        for name, family in families.items():
            self.assertEqual(name.endswith("_total"), family["type"] == "counter", name)
            for labels, value in family["samples"]:
                self.assertEqual((labels.get("pid"), labels.get("exe")), (str(pid), exe), name)
                self.assertTrue(value >= 0 and value == int(value), f"{name} {labels} {value}")
        self.check_classes(families, quiet)
        version = families["traymalloc_build_info"]["samples"][0][0]["version"]
        self.assertRegex(version, r"^\d+\.\d+\.\d+$")
        calls = {labels["call"]: value
                 for labels, value in families["traymalloc_os_calls_total"]["samples"]}
        self.assertEqual(tuple(calls), OS_CALLS)
        self.assertGreater(calls["mmap"], 0)
        (limit_labels, limit), = families["traymalloc_memory_limit_bytes"]["samples"]
        self.assertIn(limit_labels["source"], ("none", "memory_limit", "cgroup"))
        self.assertIn(limit_labels["action"], ("soft", "fail"))
        self.assertEqual(limit_labels["source"] == "none", limit == 0)
        # The families of one sample, by name less the prefix.
        value = {name[len("traymalloc_"):]: f["samples"][0][1] for name, f in families.items()
                 if name not in CLASS_FAMILIES and len(f["samples"]) == 1}
        self.assertGreater(value["resident_bytes"], 0)
        self.assertGreaterEqual(value["heaps"], value["threads"])
        self.assertLessEqual(value["large_live_bytes"], value["large_peak_bytes"])
        if quiet:
            live = sum(by_class(families, "traymalloc_class_live_bytes").values())
            reserved = sum(by_class(families, "traymalloc_class_reserved_bytes").values())
            self.assertLessEqual(live, reserved)
            self.assertLessEqual(reserved, value["committed_bytes"])
            self.assertLessEqual(value["metadata_bytes"], value["committed_bytes"])
            self.assertLessEqual(value["committed_bytes"], value["mapped_bytes"])
            self.assertEqual(value["large_allocations_total"] - value["large_frees_total"],
                             value["large_live_blocks"])
            self.assertLessEqual(value["large_live_bytes"] + value["large_cached_bytes"],
                                 value["large_mapped_bytes"])
        return families

    def check_classes(self, families, quiet):
        # Every per-class family has the same classes, in order of size.
        keys = [[(labels["size_class"], labels["class"]) for labels, _ in families[name]["samples"]]
                for name in CLASS_FAMILIES]
        self.assertTrue(all(k == keys[0] for k in keys), keys)
        sizes = [int(size) for size, _ in keys[0]]
        self.assertEqual(sizes, sorted(set(sizes)))
        self.assertEqual([int(index) for _, index in keys[0]], sorted({int(i) for _, i in keys[0]}))
        for name in CLASS_FAMILIES:
            for labels, _ in families[name]["samples"]:
                self.assertEqual(set(labels), {"pid", "exe", "size_class", "class"})
        blocks = by_class(families, "traymalloc_class_live_blocks")
        allocations = by_class(families, "traymalloc_class_allocations_total")
        frees = by_class(families, "traymalloc_class_frees_total")
        for size, live_bytes in by_class(families, "traymalloc_class_live_bytes").items():
            self.assertEqual(live_bytes, blocks[size] * size)
            if quiet:
                self.assertEqual(allocations[size] - frees[size], blocks[size], f"{size} B")


def class_for(families, name, size):
    """The value of a per-class family for the class malloc(size) uses."""
    values = by_class(families, name)
    return values[min(s for s in values if s >= size)]


class FormatTest(ExpositionChecks):
    def test_exit_dump_of_four_threads(self):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "app.prom"
            result = run_preloaded([PROBE, "threads"],
                                   ("stats=1", "stats_format=prometheus", f"stats_file={path}"))
            facts = probe_facts(result.stdout)
            families = self.check_file(path.read_text(), facts["pid"], Path(PROBE).name)
            self.assertEqual(os.listdir(folder), ["app.prom"])  # no temporary file left
        remote_frees = single(families, "traymalloc_remote_frees_total")
        self.assertGreaterEqual(remote_frees, facts["remote_frees"])
        threads_exited = single(families, "traymalloc_threads_exited_total")
        self.assertGreaterEqual(threads_exited, facts["threads"])
        self.assertEqual(single(families, "traymalloc_threads"), 1)
        # Each thread's blocks have a size class of their own: its counts are exact.
        for line in result.stdout.splitlines():
            if line.startswith("thread_blocks "):
                _, size, *pairs = line.split()
                expected = dict(zip(pairs[0::2], map(int, pairs[1::2])))
                got = {key: class_for(families, f"traymalloc_class_{name}", int(size))
                       for key, name in (("allocations", "allocations_total"),
                                         ("frees", "frees_total"), ("live", "live_blocks"))}
                self.assertEqual(got, expected, f"{size} B blocks")

    def test_a_second_process_replaces_the_file(self):
        """Dumps are not appended: the file holds the last process's dump only."""
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "app.prom"
            options = ("stats=1", "stats_format=prometheus", f"stats_file={path}")
            pids = [probe_facts(run_preloaded([PROBE, "threads"], options).stdout)["pid"]
                    for _ in range(2)]
            self.check_file(path.read_text(), pids[1], Path(PROBE).name)

    def test_the_program_name_is_escaped(self):
        """exe is the executable's file name: backslash, quote and line feed escaped, bytes that
        are not UTF-8 replaced."""
        names = ((b'say "hi"\\now\nthen', 'say "hi"\\now\nthen'),
                 ("café".encode(), "café"),
                 (b"bad\xff\xc3(", "bad??("))
        for file_name, exe in names:
            with self.subTest(exe=exe), tempfile.TemporaryDirectory() as folder:
                program = os.path.join(os.fsencode(folder), file_name)
                shutil.copy(PROBE, program)
                path = Path(folder) / "app.prom"
                result = run_preloaded([program, "threads"],
                                       ("stats=1", "stats_format=prometheus", f"stats_file={path}"))
                self.check_file(path.read_text(), probe_facts(result.stdout)["pid"], exe)


class ReplaceTest(ExpositionChecks):
    """A program allocating and freeing in four threads dumps every second (stats_interval),
    then back to back (SIGUSR1 to its threads, stats_signal), then at exit, while this test
    reads the file in a tight loop, as node_exporter may at any moment."""

    INTERVAL_DUMPS = 2   # seen before the signals start
    SIGNAL_DUMPS = 300   # seen while they come
    PATIENCE_S = 120     # for a slow machine; a healthy run takes a few seconds

    def read_until(self, path, contents, count, program):
        """Reads path until `count` different contents were seen; each whole."""
        deadline = time.monotonic() + self.PATIENCE_S
        while len(contents) < count:
            try:
                with open(path, "rb") as file:
                    data = file.read()
            except FileNotFoundError:
                # Before the first dump only: a rename never leaves the path empty.
                self.assertFalse(contents, "stats_file vanished between two dumps")
                data = None
            if data is not None and (not contents or data != contents[-1]):
                self.assertRegex(data, LAST_LINE, f"a read found a file cut short: {len(data)} B")
                contents.append(data)
            self.assertIsNone(program.poll(), "the program ended early")
            self.assertLess(time.monotonic(), deadline, f"{len(contents)} dumps of {count} seen")

    def test_every_read_finds_one_whole_dump(self):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "app.prom"
            options = ("stats=1", "stats_format=prometheus", f"stats_file={path}",
                       "stats_interval=1", "stats_signal=USR1")
            environment = dict(os.environ, LD_PRELOAD=str(LIBRARY), TRAY_OPTIONS=",".join(options))
            program = subprocess.Popen([str(PROBE), "churn"], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=environment, text=True)
            try:
                pid = probe_facts(program.stdout.readline())["pid"]
                contents = []
                self.read_until(path, contents, self.INTERVAL_DUMPS, program)
                program.stdin.write("signals\n")
                program.stdin.flush()
                self.read_until(path, contents, self.INTERVAL_DUMPS + self.SIGNAL_DUMPS, program)
                program.stdin.close()
                self.assertEqual(program.wait(timeout=60), 0)
            finally:
                if program.poll() is None:
                    program.kill()
                    program.wait()
                program.stdout.close()
            at_exit = path.read_text()
            self.assertEqual(os.listdir(folder), ["app.prom"])  # no temporary file left
        exe = Path(PROBE).name
        previous = None
        for data in contents:
            families = self.check_file(data.decode(), pid, exe, quiet=False)
            if previous is not None:
                self.check_counters_grow(previous, families)
            previous = families
        self.check_counters_grow(previous, self.check_file(at_exit, pid, exe))

    def check_counters_grow(self, earlier, later):
        for name, family in later.items():
            if family["type"] != "counter":
                continue
            before = {frozenset(labels.items()): value
                      for labels, value in earlier[name]["samples"]}
            for labels, value in family["samples"]:
                self.assertLessEqual(before.get(frozenset(labels.items()), 0), value,
                                     f"{name} {labels}")


class ParserTest(unittest.TestCase):
    """The reader above refuses what it must: a check that passes everything proves nothing."""

    GOOD = ('# HELP a_total Things, with a \\\\ and a \\n.\n# TYPE a_total counter\n'
            'a_total{pid="1",exe="x\\"y\\\\z\\n"} 3\na_total{pid="2",exe="x"} 4e3\n'
            '# HELP b Gauge.\n# TYPE b gauge\nb 1.5\n')

    def test_a_good_file_parses(self):
        families = parse_exposition(self.GOOD)
        self.assertEqual(families["a_total"]["samples"][0][0]["exe"], 'x"y\\z\n')
        self.assertEqual(families["b"]["samples"], [({}, 1.5)])

    def test_bad_files_are_refused(self):
        bad = {
            "no final line feed": self.GOOD[:-1],
            "cut short": self.GOOD[:self.GOOD.index("b 1.5")],
            "sample before TYPE": "# HELP b G.\nb 1\n# TYPE b gauge\n",
            "family split": self.GOOD + 'a_total{pid="3",exe="x"} 1\n',
            "family repeated": self.GOOD + "# HELP b G.\n# TYPE b gauge\nb 2\n",
            "series repeated": self.GOOD.replace('pid="2",exe="x"}',
                                                 'pid="1",exe="x\\"y\\\\z\\n"}'),
            "bad escape": self.GOOD.replace('x\\"y', 'x\\ty'),
            "raw quote": self.GOOD.replace('exe="x"}', 'exe="x"y"}'),
            "bad metric name": self.GOOD.replace("b 1.5", "9b 1.5"),
            "bad label name": self.GOOD.replace('pid="2"', '2pid="2"'),
            "label twice": self.GOOD.replace('pid="2",exe="x"', 'pid="2",pid="x"'),
            "trailing comma": self.GOOD.replace('exe="x"}', 'exe="x",}'),
            "bad value": self.GOOD.replace("b 1.5", "b 1.5.5"),
            "timestamp": self.GOOD.replace("b 1.5", "b 1.5 1700000000000"),
            "blank line": self.GOOD + "\n",
            "other comment": "# just a comment\n" + self.GOOD,
            "unknown type": self.GOOD.replace("b gauge", "b meter"),
            "empty family": "# HELP c C.\n# TYPE c gauge\n" + self.GOOD,
        }
        for what, text in bad.items():
            with self.subTest(what):
                with self.assertRaises(FormatError):
                    parse_exposition(text)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(f"usage: {sys.argv[0]} LIBTRAYMALLOC STATS_PROBE [unittest options]")
    LIBRARY, PROBE = (Path(p).resolve() for p in sys.argv[1:3])
    unittest.main(argv=[sys.argv[0], *sys.argv[3:]])
