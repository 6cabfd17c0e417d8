# ruby_stress.rb: the Ruby half of the ruby_stress workload (bench/workloads/ruby_stress.cpp runs
# it and explains why). Usage: ruby ruby_stress.rb THREADS ITERATIONS
#
# THREADS Ruby threads each run ITERATIONS rounds of: build a hash of string keys to arrays of
# strings of mixed lengths, now and then a large string of 10..200 KB, join it all into one text,
# split the text and parse it back, compare, upcase/downcase it, and drop most of it; one round
# in four keeps its text alive in a ring of 16 for a while. Every thread has its own
# Random.new(seed), so the work, and the checksum printed at the end, depend only on THREADS and
# ITERATIONS, not on how the threads interleave.
#
# Checks (any failure raises, so ruby exits non-zero): the parsed hash equals the built one; the
# numbers parsed back from the text add up to the sum kept while building it; a large string has
# the length, count and byte sum that arithmetic predicts; a kept text still has the length and
# byte sum it had when it was made. On success the last line is "ok CHECKSUM vmhwm_kb=PEAK".

MASK = (1 << 64) - 1
RING = 16

def mix(hash, value)
  ((hash ^ (value & MASK)) * 0x100000001B3) & MASK
end

def check(ok, what)
  raise "ruby_stress check failed: #{what}" unless ok
end

# A large string made of one chunk repeated; its length and byte sum follow from the chunk's.
def large_string(rng, round)
  chunk = "chunk-#{round}-abcdefghijklmnopqrstuvwxyz|"
  copies = (10_000 + rng.rand(190_000)) / chunk.bytesize
  big = chunk * copies
  check(big.bytesize == chunk.bytesize * copies, "large string length")
  check(big.count("|") == copies, "large string separators")
  check(big.sum(32) == (chunk.sum(32) * copies) & 0xFFFFFFFF, "large string byte sum")
  big.split("|").each { |piece| check(piece == chunk.chomp("|"), "large string piece") }
  big.bytesize
end

def one_round(rng, round, ring)
  table = {}
  number_sum = 0
  (20 + rng.rand(200)).times do |k|
    words = Array.new(1 + rng.rand(16)) do
      value = rng.rand(1 << 30)
      number_sum += value
      "w#{value}" + "x" * rng.rand(48)
    end
    table["key-#{rng.rand(1_000_000)}-#{k}"] = words
  end
  digest = 0
  digest = mix(digest, large_string(rng, round)) if rng.rand(6).zero?

  text = table.map { |key, words| "#{key}=#{words.join(',')}" }.join("\n")
  parsed = {}
  text.split("\n").each do |line|
    key, list = line.split("=", 2)
    parsed[key] = list.split(",")
  end
  check(parsed == table, "hash parsed back from its text")
  parsed_sum = parsed.each_value.sum { |words| words.sum { |word| word[1..].to_i } }
  check(parsed_sum == number_sum, "numbers parsed back from the text")
  check(text.upcase.downcase == text, "upcase/downcase round trip")

  digest = mix(digest, text.bytesize)
  digest = mix(digest, text.sum(32))
  digest = mix(digest, number_sum)
  if rng.rand(4).zero?
    slot = rng.rand(RING)
    old = ring[slot]
    if old
      check(old[0].bytesize == old[1] && old[0].sum(32) == old[2], "kept text unchanged")
    end
    ring[slot] = [text, text.bytesize, text.sum(32)]
  end
  digest
end

def work(thread, iterations)
  rng = Random.new(20_240_000 + thread)
  ring = Array.new(RING)
  checksum = thread
  iterations.times { |round| checksum = mix(checksum, one_round(rng, round, ring)) }
  ring.compact.each { |kept| check(kept[0].sum(32) == kept[2], "kept text at the end") }
  checksum
end

if ARGV.size != 2 || ARGV.any? { |arg| arg !~ /\A[1-9][0-9]*\z/ }
  warn "usage: ruby ruby_stress.rb THREADS ITERATIONS"
  exit 2
end
threads, iterations = ARGV.map(&:to_i)
results = Array.new(threads) { |t| Thread.new { work(t, iterations) } }.map(&:value)
checksum = results.reduce(0) { |hash, value| mix(hash, value) }
peak = File.read("/proc/self/status")[/^VmHWM:\s*(\d+)/, 1] || "-1"
puts "ok #{checksum} vmhwm_kb=#{peak}"
