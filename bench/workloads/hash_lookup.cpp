// hash_lookup: a big chained hash table of small nodes, read at random: the access pattern of
// an in-memory index, a cache or a symbol table, where each lookup lands on a node no cache
// line and no TLB entry still holds. 8M nodes of 48 B (key, value, chain link, payload: 384
// MiB in small blocks) are inserted, then looked up 16M times by random keys, then freed.
// With 4 KiB pages, every lookup needs a page walk; with 2 MiB huge pages over the nodes (thp
// option) the TLB covers 512 times as much. The RESULT line adds build_seconds (the inserts),
// lookup_seconds, free_seconds and anon_huge_kb (AnonHugePages of /proc/self/smaps_rollup
// once the table is built; 0 where the file cannot be read).
//
// Check: every lookup finds its node with the value its key implies, and the chains hold
// every key once.
// Ops: one lookup. seconds: the lookups alone.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common.hpp"

namespace {

constexpr uint64_t kNodes = uint64_t{8} << 20;
constexpr uint64_t kLookups = uint64_t{16} << 20;

struct Node {
  uint64_t key;
  uint64_t value;
  Node* next;
  uint64_t payload[3];
};
static_assert(sizeof(Node) == 48);

uint64_t value_of(uint64_t key) { return key * 0x9E3779B97F4A7C15ULL ^ 0x5bd1e995; }
uint64_t hash_of(uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdULL;
  return key ^ (key >> 33);
}

long anon_huge_kb() {
  FILE* rollup = std::fopen("/proc/self/smaps_rollup", "r");
  if (rollup == nullptr) return 0;
  char line[256];
  long kb = 0;
  while (std::fgets(line, sizeof line, rollup) != nullptr)
    if (std::sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
  std::fclose(rollup);
  return kb;
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"hash_lookup", 0});
  const uint64_t nodes = options.scaled(kNodes, 1024);
  const uint64_t lookups = options.scaled(kLookups, 1024);
  uint64_t buckets = 1;
  while (buckets < nodes) buckets <<= 1;

  workload::CheckCounter checks;
  workload::Stopwatch build;
  auto** table = static_cast<Node**>(std::calloc(buckets, sizeof(Node*)));
  checks.expect(table != nullptr, "hash_lookup table");
  if (table == nullptr) return workload::report("hash_lookup", 1, 0, 0, checks);
  for (uint64_t key = 0; key < nodes; ++key) {
    auto* node = static_cast<Node*>(std::malloc(sizeof(Node)));
    checks.expect(node != nullptr, "hash_lookup node");
    if (node == nullptr) break;
    Node*& head = table[hash_of(key) & (buckets - 1)];
    *node = {key, value_of(key), head, {key, key, key}};
    head = node;
  }
  const double build_seconds = build.seconds();
  const long huge_kb = anon_huge_kb();

  workload::Rng rng(42);
  uint64_t found = 0;
  workload::Stopwatch lookup;
  for (uint64_t i = 0; i < lookups; ++i) {
    const uint64_t key = rng.below(nodes);
    const Node* node = table[hash_of(key) & (buckets - 1)];
    while (node != nullptr && node->key != key) node = node->next;
    found += node != nullptr && node->value == value_of(key) ? 1 : 0;
  }
  const double lookup_seconds = lookup.seconds();
  checks.expect(found == lookups, "hash_lookup lookups");

  workload::Stopwatch release;
  uint64_t freed = 0;
  for (uint64_t b = 0; b < buckets; ++b) {
    for (Node* node = table[b]; node != nullptr;) {
      Node* next = node->next;
      checks.expect(node->payload[2] == node->key, "hash_lookup payload");
      std::free(node);
      node = next;
      ++freed;
    }
  }
  std::free(table);
  checks.expect(freed == nodes, "hash_lookup chains");
  const double free_seconds = release.seconds();

  char extra[160];
  std::snprintf(extra, sizeof extra,
                " build_seconds=%.3f lookup_seconds=%.3f free_seconds=%.3f anon_huge_kb=%ld",
                build_seconds, lookup_seconds, free_seconds, huge_kb);
  return workload::report("hash_lookup", 1, lookups, lookup_seconds, checks, extra);
}
