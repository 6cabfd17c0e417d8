# The workload programs, one <name>.cpp each; shared by bench/workloads (to build them) and
# tests/bench (to smoke-test each one).
set(TRAY_BENCH_WORKLOADS
  larson
  xmalloc
  cache_scratch
  fragmentation
  particles
  thread_churn
  large_realloc
  larson_server
  xmalloc_test
  rptest
  mstress
  malloc_large
  soak
  swing
  phases
  large_slots
  large_threads
  exchange
  hash_lookup
  alloc_test
  cache_thrash
  ruby_stress
)
