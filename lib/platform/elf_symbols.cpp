// The ELF symbol tables of loaded files (elf_symbols.hpp): files mapped read-only, their headers
// checked against the file's size before each read (a file may be anything: truncated, not
// ELF, replaced), function symbols indexed in anonymous mappings.
#include "platform/elf_symbols.hpp"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <new>

#include "core/core.hpp"
#include "platform/os.hpp"

namespace tray::os {

namespace {

// The GNU build ID among the notes of a PT_NOTE segment (entries padded to `align`), or nullptr.
const unsigned char* build_id_in(const unsigned char* notes, size_t bytes, size_t align,
                                 size_t* id_bytes) {
  size_t at = 0;
  while (bytes - at >= sizeof(Elf64_Nhdr)) {
    Elf64_Nhdr note;
    memcpy(&note, notes + at, sizeof note);  // a corrupt file's notes may be misaligned
    const size_t name_at = at + sizeof note;
    const size_t id_at = name_at + align_up(size_t(note.n_namesz), align);
    const size_t next = id_at + align_up(size_t(note.n_descsz), align);
    if (next > bytes) return nullptr;  // 32-bit sizes: no sum here can wrap
    if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 && memcmp(notes + name_at, "GNU", 4) == 0) {
      *id_bytes = note.n_descsz;
      return notes + id_at;
    }
    at = next;
  }
  return nullptr;
}

// Notes are padded to 4 bytes in ELF64 too, but for segments aligned to 8 (.note.gnu.property).
size_t note_alignment(uint64_t segment_alignment) { return segment_alignment == 8 ? 8 : 4; }

// Which of several names at one address the report shows, the lowest first: an exported name
// (global or weak) before a local alias of it, then the one with the fewest leading
// underscores, as libraries spell their public names (getpid, which glibc makes the weak alias
// of __getpid; malloc rather than __libc_malloc).
uint32_t name_rank(unsigned char info, const char* name) {
  uint32_t underscores = 0;
  while (underscores < 3 && name[underscores] == '_') ++underscores;
  return (ELF64_ST_BIND(info) == STB_LOCAL ? 4 : 0) + underscores;
}

}  // namespace

struct ElfFunctions::Entry {
  uint64_t start;
  uint32_t symbol;
  uint32_t rank;  // name_rank
};

template <class T>
const T* ElfFunctions::at(uint64_t offset, uint64_t n) const {
  if (offset > file_bytes_ || n > (file_bytes_ - offset) / sizeof(T) || offset % alignof(T) != 0)
    return nullptr;
  return reinterpret_cast<const T*>(file_ + offset);
}

bool ElfFunctions::open(const char* path) {
  close();
  const int saved = errno;
  const bool opened = map_file(path) && read_tables();
  if (!opened) close();
  errno = saved;
  return opened;
}

void ElfFunctions::close() {
  if (file_ != nullptr) munmap(const_cast<char*>(file_), file_bytes_);
  if (entries_ != nullptr) unmap(entries_, entries_bytes_);
  *this = ElfFunctions();
}

bool ElfFunctions::map_file(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat status;
  void* mapped = MAP_FAILED;
  if (fstat(fd, &status) == 0 && S_ISREG(status.st_mode) && size_t(status.st_size) >= sizeof(Elf64_Ehdr))
    mapped = mmap(nullptr, size_t(status.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED) return false;
  file_ = static_cast<const char*>(mapped);
  file_bytes_ = size_t(status.st_size);
  return true;
}

bool ElfFunctions::read_tables() {
  const auto* header = at<Elf64_Ehdr>(0, 1);
  const unsigned char native_order = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;
  if (header == nullptr || memcmp(header->e_ident, ELFMAG, SELFMAG) != 0 ||
      header->e_ident[EI_CLASS] != ELFCLASS64 || header->e_ident[EI_DATA] != native_order ||
      header->e_shentsize != sizeof(Elf64_Shdr))
    return false;
  read_build_id();
  if (header->e_shoff == 0) return true;  // no section headers: nothing to name with
  // More sections than e_shnum can count: the first section header's size holds the number.
  const Elf64_Shdr* first = at<Elf64_Shdr>(header->e_shoff, 1);
  if (first == nullptr) return false;
  const uint64_t count = header->e_shnum != 0 ? header->e_shnum : first->sh_size;
  const Elf64_Shdr* sections = at<Elf64_Shdr>(header->e_shoff, count);
  if (sections == nullptr) return false;
  for (const uint32_t type : {SHT_SYMTAB, SHT_DYNSYM}) {
    for (size_t i = 0; i < count; ++i) {
      if (sections[i].sh_type == type && index_table(sections, count, i)) return true;
    }
  }
  return true;  // stripped of both: a file whose frames go unnamed
}

void ElfFunctions::read_build_id() {
  const auto* header = reinterpret_cast<const Elf64_Ehdr*>(file_);
  if (header->e_phentsize != sizeof(Elf64_Phdr)) return;
  const Elf64_Phdr* segments = at<Elf64_Phdr>(header->e_phoff, header->e_phnum);
  for (size_t i = 0; segments != nullptr && i < header->e_phnum && build_id_ == nullptr; ++i) {
    if (segments[i].p_type != PT_NOTE) continue;
    const auto* notes = at<unsigned char>(segments[i].p_offset, segments[i].p_filesz);
    if (notes == nullptr) continue;
    const size_t align = note_alignment(segments[i].p_align);
    build_id_ = build_id_in(notes, segments[i].p_filesz, align, &build_id_bytes_);
  }
}

bool ElfFunctions::index_table(const void* section_headers, size_t section_count, size_t table) {
  const auto* sections = static_cast<const Elf64_Shdr*>(section_headers);
  const Elf64_Shdr& section = sections[table];
  if (section.sh_entsize != sizeof(Elf64_Sym) || section.sh_link >= section_count) return false;
  const Elf64_Shdr& strings = sections[section.sh_link];
  const uint64_t symbol_count = section.sh_size / sizeof(Elf64_Sym);
  const Elf64_Sym* symbols = at<Elf64_Sym>(section.sh_offset, symbol_count);
  const char* names = at<char>(strings.sh_offset, strings.sh_size);
  if (symbols == nullptr || names == nullptr || strings.sh_type != SHT_STRTAB || strings.sh_size == 0 ||
      names[strings.sh_size - 1] != '\0')
    return false;
  auto is_function = [&](const Elf64_Sym& symbol) {
    return ELF64_ST_TYPE(symbol.st_info) == STT_FUNC && symbol.st_shndx != SHN_UNDEF &&
           symbol.st_size != 0 && symbol.st_name != 0 && symbol.st_name < strings.sh_size;
  };
  if (symbol_count > UINT32_MAX) return false;
  size_t functions = 0;
  for (uint64_t i = 0; i < symbol_count; ++i) functions += is_function(symbols[i]) ? 1 : 0;
  if (functions == 0) return false;
  entries_bytes_ = functions * sizeof(Entry);
  entries_ = static_cast<Entry*>(map(entries_bytes_));
  if (entries_ == nullptr) return false;
  for (uint64_t i = 0; i < symbol_count; ++i) {
    if (is_function(symbols[i]))
      entries_[entry_count_++] = {symbols[i].st_value, uint32_t(i),
                                  name_rank(symbols[i].st_info, names + symbols[i].st_name)};
  }
  std::sort(entries_, entries_ + entry_count_, [](const Entry& a, const Entry& b) {
    if (a.start != b.start) return a.start < b.start;
    return a.rank != b.rank ? a.rank < b.rank : a.symbol < b.symbol;
  });
  symbols_ = symbols;
  names_ = names;
  return true;
}

const char* ElfFunctions::function_at(uintptr_t address, uintptr_t* start) const {
  const Entry* first = entries_;
  const Entry* after = std::upper_bound(first, first + entry_count_, uint64_t(address),
                                        [](uint64_t a, const Entry& entry) { return a < entry.start; });
  if (after == first) return nullptr;
  const uint64_t nearest = after[-1].start;
  const Entry* alias = std::lower_bound(first, after, nearest,
                                        [](const Entry& entry, uint64_t a) { return entry.start < a; });
  const auto* symbols = static_cast<const Elf64_Sym*>(symbols_);
  for (; alias != after; ++alias) {
    const Elf64_Sym& symbol = symbols[alias->symbol];
    if (address - nearest < symbol.st_size) {
      *start = nearest;
      return names_ + symbol.st_name;
    }
  }
  return nullptr;
}

struct SymbolTables::LoadedFile {
  uintptr_t bias;       // what the loader added to the file's addresses
  uintptr_t low, high;  // the run-time addresses its loaded segments span
  const char* path;       // the loader's name for it; the executable's path for the executable
  const char* open_path;  // what open() takes: /proc/self/exe for the executable
  const unsigned char* build_id;  // from its notes in memory; nullptr if none
  size_t build_id_bytes;
  enum State : uint8_t { kUnread, kRead, kUnreadable } state;
  ElfFunctions functions;
};

SymbolTables::~SymbolTables() {
  for (size_t i = 0; i < file_count_; ++i) files_[i].functions.close();
  if (files_ != nullptr) unmap(files_, files_bytes_);
}

void SymbolTables::list_loaded_files() {
  listed_ = true;
  size_t count = 0;
  dl_iterate_phdr(
      [](dl_phdr_info*, size_t, void* data) {
        ++*static_cast<size_t*>(data);
        return 0;
      },
      &count);
  if (count == 0) return;
  files_bytes_ = count * sizeof(LoadedFile);
  files_ = static_cast<LoadedFile*>(map(files_bytes_));
  if (files_ == nullptr) return;
  struct Listing {
    LoadedFile* files;
    size_t capacity;
    size_t count;
  } listing{files_, count, 0};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto& list = *static_cast<Listing*>(data);
        if (list.count == list.capacity) return 1;  // loaded since they were counted
        const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        LoadedFile file{info->dlpi_addr, UINTPTR_MAX, 0, name, name, nullptr, 0, LoadedFile::kUnread, {}};
        for (size_t i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& segment = info->dlpi_phdr[i];
          const uintptr_t start = info->dlpi_addr + segment.p_vaddr;
          if (segment.p_type == PT_LOAD) {
            file.low = std::min(file.low, start);
            file.high = std::max(file.high, start + segment.p_memsz);
          } else if (segment.p_type == PT_NOTE && file.build_id == nullptr) {
            file.build_id = build_id_in(reinterpret_cast<const unsigned char*>(start), segment.p_memsz,
                                        note_alignment(segment.p_align), &file.build_id_bytes);
          }
        }
        if (file.low < file.high) new (&list.files[list.count++]) LoadedFile(file);
        return 0;
      },
      &listing);
  file_count_ = listing.count;
  // The executable is the one the loader leaves unnamed; /proc/self/exe opens it even where
  // its path has gone or changed since.
  for (size_t i = 0; i < file_count_; ++i) {
    if (files_[i].path[0] != '\0') continue;
    const ssize_t length = executable_path(executable_, sizeof executable_ - 1);
    if (length <= 0) __builtin_memcpy(executable_, "/proc/self/exe", sizeof "/proc/self/exe");
    else executable_[length] = '\0';
    files_[i].path = executable_;
    files_[i].open_path = "/proc/self/exe";
    break;
  }
}

bool SymbolTables::read(LoadedFile& file) {
  if (file.state == LoadedFile::kUnread) {
    file.state = LoadedFile::kUnreadable;
    // A name without a slash is no path: the vDSO's, which lies in no file.
    if (strchr(file.open_path, '/') != nullptr && file.functions.open(file.open_path)) {
      size_t id_bytes = 0;
      const unsigned char* id = file.functions.build_id(&id_bytes);
      // A file replaced on disk since it was loaded (a package upgraded under a running
      // program) would name the wrong functions.
      if (id != nullptr && file.build_id != nullptr &&
          (id_bytes != file.build_id_bytes || memcmp(id, file.build_id, id_bytes) != 0))
        file.functions.close();
      else
        file.state = LoadedFile::kRead;
    }
  }
  return file.state == LoadedFile::kRead;
}

CodeSymbol SymbolTables::symbol_of_return_address(const void* address) {
  const int saved = errno;
  if (!listed_) list_loaded_files();
  const uintptr_t call = reinterpret_cast<uintptr_t>(address) - 1;
  CodeSymbol symbol{nullptr, 0, nullptr, 0};
  LoadedFile* file = nullptr;
  for (size_t i = 0; i < file_count_ && file == nullptr; ++i) {
    if (files_[i].low <= call && call < files_[i].high) file = &files_[i];
  }
  if (file != nullptr) {
    symbol.file = file->path;
    symbol.file_address = call + 1 - file->bias;
  }
  uintptr_t start = 0;
  if (file != nullptr && read(*file)) {
    symbol.name = file->functions.function_at(call - file->bias, &start);
    symbol.offset = call + 1 - file->bias - start;
  } else {
    const char* exporter = nullptr;
    symbol.name = symbol_of(address, &symbol.offset, &exporter);
    if (symbol.file == nullptr) symbol.file = exporter;
  }
  if (symbol.name == nullptr) symbol.offset = 0;
  errno = saved;
  return symbol;
}

}  // namespace tray::os
