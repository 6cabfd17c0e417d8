#include "platform/unwind.hpp"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>

#include "core/core.hpp"
#include "platform/config.hpp"

// The rules below are x86-64's; glibc 2.35 brought _dl_find_object, the loader's lock-free
// answer to "which object's .eh_frame_hdr covers this address". Elsewhere every walk goes to
// libgcc.
#if defined(__x86_64__) && defined(DLFO_STRUCT_HAS_EH_DBASE)

// The registers of its caller at the call: the return address, rsp as it was before the call
// pushed it, and rbp, which this function leaves alone. In assembly because no compiler
// builtin gives the caller's rbp whatever the caller's frame looks like.
extern "C" void tray_unwind_registers(uintptr_t registers[3]);
asm(R"(
  .text
  .p2align 4
  .globl tray_unwind_registers
  .hidden tray_unwind_registers
  .type tray_unwind_registers, @function
tray_unwind_registers:
  .cfi_startproc
  movq (%rsp), %rax
  movq %rax, (%rdi)
  leaq 8(%rsp), %rax
  movq %rax, 8(%rdi)
  movq %rbp, 16(%rdi)
  ret
  .cfi_endproc
  .size tray_unwind_registers, .-tray_unwind_registers
)");

namespace tray::os {
namespace {

// DWARF register numbers of x86-64 (System V psABI): rbp, rsp, and the return address column.
constexpr uint64_t kRegBp = 6, kRegSp = 7, kRegReturn = 16;

// A cache slot holds a return address (user-space code lies below 2^47) and the rule for its
// frame in the 17 bits above: bit 47, the CFA is rbp + offset (else rsp + offset); bits 48-50,
// the caller's rbp was saved at CFA - 8 * slot (0: rbp is unchanged); bits 51-63, the offset
// in 8-byte words. Offset 0 marks the two ends: the outermost frame (no return address), and
// a frame libgcc must walk. One word per slot, so a reader never sees half of a writer's.
constexpr int kAddressBits = 47;
constexpr uint64_t kAddressMask = (uint64_t{1} << kAddressBits) - 1;
constexpr uint64_t kFromBp = uint64_t{1} << 47;
constexpr int kBpSlotShift = 48;
constexpr uint64_t kBpSlotMax = 7;
constexpr int kOffsetShift = 51;
constexpr uint64_t kOffsetWordsMax = (uint64_t{1} << (64 - kOffsetShift)) - 1;
constexpr uint64_t kRuleOutermost = 0;
constexpr uint64_t kRuleLibgcc = kFromBp;

static_assert(kUnwindCacheSlots >= kUnwindCacheProbes && (kUnwindCacheSlots & (kUnwindCacheSlots - 1)) == 0);
constinit std::atomic<uint64_t> g_cache[kUnwindCacheSlots];
// The loader's count of unloaded objects when the cache was last emptied: an address of an
// unloaded object may hold other code later.
std::atomic<unsigned long long> g_unloads_seen{0};

// --- reading .eh_frame -------------------------------------------------------------------

template <typename T>
T load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

uint64_t read_uleb(const uint8_t*& p) {
  uint64_t value = 0;
  for (unsigned shift = 0;; shift += 7) {
    const uint8_t byte = *p++;
    if (shift < 64) value |= uint64_t(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return value;
  }
}

int64_t read_sleb(const uint8_t*& p) {
  uint64_t value = 0;
  unsigned shift = 0;
  uint8_t byte;
  do {
    byte = *p++;
    if (shift < 64) value |= uint64_t(byte & 0x7f) << shift;
    shift += 7;
  } while (byte & 0x80);
  if (shift < 64 && (byte & 0x40)) value |= ~uint64_t{0} << shift;
  return int64_t(value);
}

// The value of a pointer field in one of the DW_EH_PE encodings, as stored (the low nibble
// says how); false for storage forms that .eh_frame does not use.
bool read_stored(const uint8_t*& p, uint8_t encoding, uintptr_t* out) {
  switch (encoding & 0x0f) {
    case 0x00: case 0x04: case 0x0c: *out = load<uint64_t>(p); p += 8; return true;
    case 0x01: *out = read_uleb(p); return true;
    case 0x02: *out = load<uint16_t>(p); p += 2; return true;
    case 0x03: *out = load<uint32_t>(p); p += 4; return true;
    case 0x09: *out = uintptr_t(read_sleb(p)); return true;
    case 0x0a: *out = uintptr_t(int64_t(load<int16_t>(p))); p += 2; return true;
    case 0x0b: *out = uintptr_t(int64_t(load<int32_t>(p))); p += 4; return true;
    default: return false;
  }
}

// A pointer field resolved: bits 4-6 of the encoding say what it is relative to (here the
// field itself, or `data_base`). false for what the walks here never meet.
bool read_encoded(const uint8_t*& p, uint8_t encoding, uintptr_t data_base, uintptr_t* out) {
  const uint8_t* const field = p;
  uintptr_t value;
  if ((encoding & 0x80) != 0 || !read_stored(p, encoding, &value)) return false;  // 0x80: indirect
  switch (encoding & 0x70) {
    case 0x00: break;
    case 0x10: value += reinterpret_cast<uintptr_t>(field); break;
    case 0x30: if (data_base == 0) return false; value += data_base; break;
    default: return false;
  }
  *out = value;
  return true;
}

// The FDE whose code may hold `address`, from the binary-search table of the object's
// .eh_frame_hdr (as libgcc finds it); nullptr if there is none.
const uint8_t* find_fde(uintptr_t address) {
  dl_find_object object;
  if (_dl_find_object(reinterpret_cast<void*>(address), &object) != 0 || object.dlfo_eh_frame == nullptr)
    return nullptr;
  const auto* header = static_cast<const uint8_t*>(object.dlfo_eh_frame);
  const auto base = reinterpret_cast<uintptr_t>(header);
  constexpr uint8_t kDatarelSdata4 = 0x3b;
  if (header[0] != 1 || header[3] != kDatarelSdata4) return nullptr;
  const uint8_t* p = header + 4;
  uintptr_t eh_frame, count;
  if (!read_encoded(p, header[1], base, &eh_frame) || !read_encoded(p, header[2], base, &count) || count == 0)
    return nullptr;
  // Pairs of (start of the function, its FDE), both relative to the header, by start.
  size_t low = 0, high = count;
  while (high - low > 1) {
    const size_t mid = (low + high) / 2;
    if (base + uintptr_t(int64_t(load<int32_t>(p + mid * 8))) <= address) low = mid;
    else high = mid;
  }
  if (base + uintptr_t(int64_t(load<int32_t>(p + low * 8))) > address) return nullptr;
  return header + load<int32_t>(p + low * 8 + 4);
}

// How the walk finds a saved register: unchanged, at CFA + offset, gone (the outermost
// frame's return address), or some way the cache does not keep.
enum class How : uint8_t { kSame, kAtCfa, kUndefined, kOther };
struct Saved {
  How how = How::kSame;
  int64_t offset = 0;
};
struct Row {
  uint64_t cfa_register = kRegSp;
  int64_t cfa_offset = 8;
  bool cfa_other = false;  // DW_CFA_def_cfa_expression
  Saved bp, ra;
};

struct Cie {
  uint64_t code_align = 1;
  int64_t data_align = 1;
  uint64_t ra_register = kRegReturn;
  uint8_t fde_encoding = 0;
  bool augmented = false;  // 'z': the FDE has augmentation data to skip
  bool signal_frame = false;
  const uint8_t* program = nullptr;
  const uint8_t* program_end = nullptr;
};

bool parse_cie(const uint8_t* cie, Cie* out) {
  const uint32_t length = load<uint32_t>(cie);
  if (length == 0 || length == 0xffffffff || load<uint32_t>(cie + 4) != 0) return false;
  out->program_end = cie + 4 + length;
  const uint8_t version = cie[8];
  const char* augmentation = reinterpret_cast<const char*>(cie + 9);
  const uint8_t* p = cie + 9 + std::strlen(augmentation) + 1;
  if (version != 1 && version != 3) return false;
  out->code_align = read_uleb(p);
  out->data_align = read_sleb(p);
  out->ra_register = version == 1 ? *p++ : read_uleb(p);
  if (augmentation[0] == 'z') {
    out->augmented = true;
    const uint64_t data_length = read_uleb(p);
    const uint8_t* data = p;
    for (const char* a = augmentation + 1; *a != '\0'; ++a) {
      if (*a == 'R') out->fde_encoding = *data++;
      else if (*a == 'L') ++data;
      else if (*a == 'S') out->signal_frame = true;
      else if (*a == 'P') {  // the personality routine: passed over
        const uint8_t encoding = *data++;
        uintptr_t ignored;
        if (!read_stored(data, encoding, &ignored)) return false;
      } else if (*a != 'B') {
        return false;
      }
    }
    p += data_length;
  } else if (augmentation[0] != '\0') {
    return false;
  }
  out->program = p;
  return true;
}

// The rule of `reg` if the walk needs it: rbp, or the return address. Other registers are
// left out: a CFA that hangs from one of them is not cached anyway.
template <typename R>
auto column(R& row, const Cie& cie, uint64_t reg) -> decltype(&row.bp) {
  if (reg == kRegBp) return &row.bp;
  if (reg == cie.ra_register) return &row.ra;
  return nullptr;
}

constexpr int kRememberDepth = 8;

// Runs a DWARF call-frame program from `location` while the row it describes starts at or
// before `target` (the whole program when `target` is ~0). false on what the cache cannot
// use anyway, or a malformed program.
bool run_program(const uint8_t* p, const uint8_t* end, const Cie& cie, const Row& initial,
                 uintptr_t location, uintptr_t target, Row* row) {
  Row remembered[kRememberDepth];
  int depth = 0;
  while (p < end) {
    const uint8_t op = *p++;
    uint64_t reg = op & 0x3f;
    Saved* saved;
    switch (op >> 6) {
      case 1:  // DW_CFA_advance_loc
        location += reg * cie.code_align;
        if (location > target) return true;
        continue;
      case 2:  // DW_CFA_offset
        if ((saved = column(*row, cie, reg)) != nullptr)
          *saved = Saved{How::kAtCfa, int64_t(read_uleb(p)) * cie.data_align};
        else
          read_uleb(p);
        continue;
      case 3:  // DW_CFA_restore
        if ((saved = column(*row, cie, reg)) != nullptr) *saved = *column(initial, cie, reg);
        continue;
      default:
        break;
    }
    uint64_t delta = 0;
    switch (op) {
      case 0x00: break;  // nop
      case 0x01:         // set_loc
        if (!read_encoded(p, cie.fde_encoding, 0, &location)) return false;
        if (location > target) return true;
        break;
      case 0x02: delta = *p++; break;
      case 0x03: delta = load<uint16_t>(p); p += 2; break;
      case 0x04: delta = load<uint32_t>(p); p += 4; break;
      case 0x05:  // offset_extended
      case 0x11:  // offset_extended_sf
      case 0x2f: {  // GNU_negative_offset_extended
        reg = read_uleb(p);
        const int64_t factor = op == 0x05 ? int64_t(read_uleb(p)) : op == 0x11 ? read_sleb(p) : -int64_t(read_uleb(p));
        if ((saved = column(*row, cie, reg)) != nullptr) *saved = Saved{How::kAtCfa, factor * cie.data_align};
        break;
      }
      case 0x06:  // restore_extended
        reg = read_uleb(p);
        if ((saved = column(*row, cie, reg)) != nullptr) *saved = *column(initial, cie, reg);
        break;
      case 0x07:  // undefined
      case 0x08:  // same_value
        reg = read_uleb(p);
        if ((saved = column(*row, cie, reg)) != nullptr) *saved = Saved{op == 0x07 ? How::kUndefined : How::kSame, 0};
        break;
      case 0x09:  // register
        reg = read_uleb(p);
        read_uleb(p);
        if ((saved = column(*row, cie, reg)) != nullptr) *saved = Saved{How::kOther, 0};
        break;
      case 0x0a:  // remember_state
        if (depth == kRememberDepth) return false;
        remembered[depth++] = *row;
        break;
      case 0x0b:  // restore_state
        if (depth == 0) return false;
        *row = remembered[--depth];
        break;
      case 0x0c:  // def_cfa
        row->cfa_register = read_uleb(p);
        row->cfa_offset = int64_t(read_uleb(p));
        row->cfa_other = false;
        break;
      case 0x12:  // def_cfa_sf
        row->cfa_register = read_uleb(p);
        row->cfa_offset = read_sleb(p) * cie.data_align;
        row->cfa_other = false;
        break;
      case 0x0d: row->cfa_register = read_uleb(p); row->cfa_other = false; break;
      case 0x0e: row->cfa_offset = int64_t(read_uleb(p)); break;
      case 0x13: row->cfa_offset = read_sleb(p) * cie.data_align; break;
      case 0x0f:  // def_cfa_expression
        row->cfa_other = true;
        p += read_uleb(p);
        break;
      case 0x10:  // expression
      case 0x16:  // val_expression
        reg = read_uleb(p);
        p += read_uleb(p);
        if ((saved = column(*row, cie, reg)) != nullptr) *saved = Saved{How::kOther, 0};
        break;
      case 0x14:  // val_offset
      case 0x15:  // val_offset_sf
        reg = read_uleb(p);
        read_uleb(p);  // an sleb128 has the same length
        if ((saved = column(*row, cie, reg)) != nullptr) *saved = Saved{How::kOther, 0};
        break;
      case 0x2e: read_uleb(p); break;  // GNU_args_size: only for landing pads
      default: return false;
    }
    if (delta != 0) {
      location += delta * cie.code_align;
      if (location > target) return true;
    }
  }
  return true;
}

// The cache word for a return address whose call instruction ends at `ra`.
uint64_t decode_rule(uintptr_t ra) {
  const uintptr_t address = ra - 1;  // inside the call, not past a noreturn call's function
  const uint8_t* fde = find_fde(address);
  if (fde == nullptr) return kRuleLibgcc;
  const uint32_t length = load<uint32_t>(fde);
  if (length == 0 || length == 0xffffffff) return kRuleLibgcc;
  const uint8_t* p = fde + 8;
  Cie cie;
  if (!parse_cie(fde + 4 - load<uint32_t>(fde + 4), &cie) || cie.signal_frame) return kRuleLibgcc;
  uintptr_t start, size;
  if (!read_encoded(p, cie.fde_encoding, 0, &start) || !read_encoded(p, cie.fde_encoding & 0x0f, 0, &size) ||
      address < start || address - start >= size)
    return kRuleLibgcc;
  if (cie.augmented) p += read_uleb(p);
  Row initial;
  if (!run_program(cie.program, cie.program_end, cie, initial, start, ~uintptr_t{0}, &initial))
    return kRuleLibgcc;
  Row row = initial;
  if (!run_program(p, fde + 4 + length, cie, initial, start, address, &row)) return kRuleLibgcc;

  if (row.ra.how == How::kUndefined) return kRuleOutermost;
  if (row.ra.how != How::kAtCfa || row.ra.offset != -8 || row.cfa_other) return kRuleLibgcc;
  if (row.cfa_register != kRegSp && row.cfa_register != kRegBp) return kRuleLibgcc;
  if (row.cfa_offset <= 0 || row.cfa_offset % 8 != 0 || uint64_t(row.cfa_offset / 8) > kOffsetWordsMax)
    return kRuleLibgcc;
  uint64_t bp_slot = 0;
  if (row.bp.how == How::kAtCfa) {
    if (row.bp.offset >= 0 || row.bp.offset % 8 != 0 || uint64_t(-row.bp.offset / 8) > kBpSlotMax)
      return kRuleLibgcc;
    bp_slot = uint64_t(-row.bp.offset / 8);
  } else if (row.bp.how != How::kSame) {
    return kRuleLibgcc;
  }
  return (uint64_t(row.cfa_offset / 8) << kOffsetShift) | (bp_slot << kBpSlotShift) |
         (row.cfa_register == kRegBp ? kFromBp : 0);
}

size_t home_slot(uintptr_t ra) {
  constexpr int kBits = std::countr_zero(kUnwindCacheSlots);
  return size_t((ra * 0x9E3779B97F4A7C15ULL) >> (64 - kBits));
}

uint64_t rule_of(uintptr_t ra) {
  const size_t home = home_slot(ra);
  for (size_t i = 0; i < kUnwindCacheProbes; ++i) {
    const uint64_t word = g_cache[(home + i) & (kUnwindCacheSlots - 1)].load(std::memory_order_relaxed);
    if ((word & kAddressMask) == ra) return word & ~kAddressMask;
    if (word == 0) break;
  }
  const uint64_t rule = decode_rule(ra);
  // The first free slot of the run, else the home slot's word gives way.
  size_t slot = home;
  for (size_t i = 0; i < kUnwindCacheProbes; ++i) {
    const size_t probe = (home + i) & (kUnwindCacheSlots - 1);
    if (g_cache[probe].load(std::memory_order_relaxed) == 0) {
      slot = probe;
      break;
    }
  }
  g_cache[slot].store(rule | ra, std::memory_order_relaxed);
  return rule;
}

int read_unloads(dl_phdr_info* info, size_t, void* out) {
  *static_cast<unsigned long long*>(out) = info->dlpi_subs;
  return 1;
}

// dl_iterate_phdr holds the loader's lock while it calls back: a moment, once a walk.
void forget_unloaded_code() {
  unsigned long long unloads = 0;
  dl_iterate_phdr(read_unloads, &unloads);
  if (TRAY_LIKELY(unloads == g_unloads_seen.load(std::memory_order_relaxed))) return;
  for (auto& slot : g_cache) slot.store(0, std::memory_order_relaxed);
  g_unloads_seen.store(unloads, std::memory_order_relaxed);
}

}  // namespace

// Reads the return-address and saved-rbp slots of every frame above this one: ASan leaves
// them unpoisoned, but its stack instrumentation has no business here.
__attribute__((noinline, no_sanitize("address", "thread")))
int unwind_stack(void** frames, int capacity) {
  forget_unloaded_code();
  uintptr_t registers[3];
  tray_unwind_registers(registers);
  uintptr_t ra = registers[0], sp = registers[1], bp = registers[2];
  int count = -1;  // the first return address lies in this function
  while (count < capacity) {
    if (count >= 0) frames[count] = reinterpret_cast<void*>(ra);
    ++count;
    if (ra > kAddressMask) return -1;
    const uint64_t rule = rule_of(ra);
    const uint64_t offset = (rule >> kOffsetShift) * 8;
    if (offset == 0) return rule == kRuleOutermost ? count : -1;
    const uintptr_t cfa = ((rule & kFromBp) != 0 ? bp : sp) + offset;
    if (cfa <= sp) return -1;  // stacks grow down: anything else is not a stack
    const uint64_t bp_slot = (rule >> kBpSlotShift) & kBpSlotMax;
    if (bp_slot != 0) bp = *reinterpret_cast<const uintptr_t*>(cfa - bp_slot * 8);
    ra = *reinterpret_cast<const uintptr_t*>(cfa - 8);
    sp = cfa;
    if (ra == 0) return count;  // libgcc ends there too
  }
  return count;
}

}  // namespace tray::os

#else

namespace tray::os {
int unwind_stack(void**, int) { return -1; }
}  // namespace tray::os

#endif
