#include "heap/sample_countdown.hpp"

#include <bit>
#include <climits>

#include "options/options.hpp"
#include "platform/platform.hpp"

namespace tray {

constinit std::atomic<uint32_t> g_sample_generation{1};
__thread unsigned tls_sampling_paused = 0;

namespace {

// Intervals are capped so that a sum of them cannot overflow the countdown.
constexpr int64_t kMaxIntervalBytes = int64_t{1} << 52;

// The mean interval of the sampler with bit `index`; 0 when it is off.
int64_t mean_bytes(unsigned index) {
  switch (1u << index) {
    case kSamplerProf: return option(Option::kProf) != 0 ? option(Option::kProfSample) : 0;
    case kSamplerGuard: return option(Option::kGuardSample);
    default: return 0;
  }
}

uint64_t next_random(SampleState& state) {
  if (state.rng == 0) state.rng = os::random_u64() | 1;
  // xorshift64*: plenty for picking sample points, and nothing to lock
  state.rng ^= state.rng >> 12;
  state.rng ^= state.rng << 25;
  state.rng ^= state.rng >> 27;
  return state.rng * 0x2545F4914F6CDD1DULL;
}

// ln(x) for x in (0, 1], to about 1e-6 relative, without libm (static users linking a C
// program would need -lm otherwise): x = 2^e * m with m in [1, 2), and ln(m) from the series
// of atanh, whose argument stays below 1/3.
double log_unit(double x) {
  const uint64_t bits = std::bit_cast<uint64_t>(x);
  const int exponent = int((bits >> 52) & 0x7ff) - 1023;
  const double mantissa = std::bit_cast<double>((bits & ((uint64_t{1} << 52) - 1)) | (uint64_t{1023} << 52));
  const double t = (mantissa - 1) / (mantissa + 1);
  const double t2 = t * t;
  const double ln_mantissa = 2 * t * (1 + t2 * (1.0 / 3 + t2 * (1.0 / 5 + t2 * (1.0 / 7 + t2 * (1.0 / 9 + t2 / 11)))));
  return exponent * 0.6931471805599453 + ln_mantissa;
}

// An exponentially distributed interval with the given mean: the gaps between the points of
// a Poisson process over the bytes allocated, so every byte is equally likely to be sampled.
int64_t draw_interval(SampleState& state, int64_t mean) {
  const double uniform = double((next_random(state) >> 11) + 1) * 0x1p-53;  // (0, 1]
  const double interval = -log_unit(uniform) * double(mean);
  return interval < double(kMaxIntervalBytes) ? int64_t(interval) : kMaxIntervalBytes;
}

// The countdown restarts from the smallest interval left of the samplers that are on.
void arm(Heap* heap, unsigned stream) {
  SampleState& state = heap->sampling;
  int64_t countdown = INT64_MAX;
  for (unsigned i = 0; i < kSamplerCount; ++i) {
    const int64_t left = state.left[stream][i];
    if (left >= 0 && left < countdown) countdown = left;
  }
  state.armed[stream] = countdown;
  countdown_of(heap, stream) = countdown;
}

}  // namespace

void sample_options_changed() { g_sample_generation.fetch_add(1, std::memory_order_relaxed); }

void sample_refresh(Heap* heap) {
  SampleState& state = heap->sampling;
  state.generation = g_sample_generation.load(std::memory_order_relaxed);
  int64_t means[kSamplerCount];
  // A checked heap samples nothing: debug mode checks every block already.
  for (unsigned i = 0; i < kSamplerCount; ++i) means[i] = heap->checked ? 0 : mean_bytes(i);
  for (unsigned stream = 0; stream < kSampleStreams; ++stream) {
    for (unsigned i = 0; i < kSamplerCount; ++i)
      state.left[stream][i] = means[i] > 0 ? draw_interval(state, means[i]) : -1;
    arm(heap, stream);
  }
}

unsigned sample_take(Heap* heap, unsigned stream) {
  SampleState& state = heap->sampling;
  if (state.generation != g_sample_generation.load(std::memory_order_relaxed)) {
    sample_refresh(heap);
    return 0;
  }
  // The countdown is below zero, so this is more than what was left when it was armed.
  const int64_t elapsed = state.armed[stream] - countdown_of(heap, stream);
  unsigned fired = 0;
  for (unsigned i = 0; i < kSamplerCount; ++i) {
    int64_t& left = state.left[stream][i];
    if (left < 0) continue;
    left -= elapsed;
    if (left < 0) {
      fired |= 1u << i;
      left = draw_interval(state, mean_bytes(i));
    }
  }
  arm(heap, stream);
  return tls_sampling_paused == 0 ? fired : 0;
}

size_t sample_class_alignment(unsigned size_class) {
  const size_t block = class_size(size_class);
  const size_t natural = block & (~block + 1);  // lowest set bit
  return natural < kUnitBytes ? natural : kUnitBytes;
}

}  // namespace tray
