// Names for code addresses from the ELF symbol tables of the files the process has loaded, as
// sanitizers' reports have them. dladdr reads only the dynamic symbol table (.dynsym), which
// holds what a file exports: the static functions of every program, and all the functions of a
// program linked without -rdynamic, are missing from it. The full table (.symtab) lies in the
// file and is never loaded: each file a looked-up address lies in is mapped read-only, its
// .symtab (its .dynsym where the file was stripped) indexed by address, and all of it unmapped
// with the SymbolTables. The memory comes from mappings of its own, never from the heap: the
// leak report that uses it runs at exit, inside the allocator. Names are as the tables spell
// them: C++ names mangled (demangling allocates).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tray::os {

// One ELF64 file's function symbols, by address. Zero-initialised, it holds nothing.
class ElfFunctions {
 public:
  // Maps `path` and indexes the functions of its .symtab, or of its .dynsym if it has none:
  // false, holding nothing, if the file cannot be mapped, is not ELF64 of this machine's byte
  // order, or its headers point outside it. True for a file whose tables hold no function.
  bool open(const char* path);
  void close();  // unmaps what open mapped; open may be called again
  // The function whose symbol covers `address` (an address as the file counts them: the
  // run-time address less the file's load bias): its name, and its first address in *start;
  // nullptr if no function symbol covers it. Of aliases, the exported name with the fewest
  // leading underscores.
  const char* function_at(uintptr_t address, uintptr_t* start) const;
  // The file's GNU build ID from its notes (nullptr if it has none), and its length.
  const unsigned char* build_id(size_t* bytes) const {
    *bytes = build_id_bytes_;
    return build_id_;
  }

 private:
  struct Entry;  // a function: its first address and its symbol
  bool map_file(const char* path);
  bool read_tables();
  bool index_table(const void* sections, size_t section_count, size_t table);
  void read_build_id();
  // The n-th T at `offset` of the file, if all n lie in it and the first is aligned for T.
  template <class T>
  const T* at(uint64_t offset, uint64_t n) const;

  const char* file_ = nullptr;  // the whole file, mapped read-only
  size_t file_bytes_ = 0;
  const void* symbols_ = nullptr;  // the table indexed (Elf64_Sym)
  const char* names_ = nullptr;    // its string table, which ends in a NUL
  Entry* entries_ = nullptr;  // sorted by address, then by which name to show
  size_t entry_count_ = 0;
  size_t entries_bytes_ = 0;
  const unsigned char* build_id_ = nullptr;
  size_t build_id_bytes_ = 0;
};

// What the symbol tables say of a code address.
struct CodeSymbol {
  const char* file;        // the loaded file that holds the address; nullptr if none does
  uintptr_t file_address;  // the address as the file counts it: what `addr2line -e FILE` takes
  const char* name;        // the function that holds it; nullptr if no symbol table names it
  uintptr_t offset;        // of the address from the function's first byte
};

// The loaded files (dl_iterate_phdr, at the first lookup), each file read at the first lookup
// of an address in it. Where a file cannot be read (the vDSO, a file replaced on disk since it
// was loaded, as its build ID shows), dladdr names what the file exports. Not
// async-signal-safe: dl_iterate_phdr and dladdr take the loader's locks.
class SymbolTables {
 public:
  SymbolTables() = default;
  SymbolTables(const SymbolTables&) = delete;
  SymbolTables& operator=(const SymbolTables&) = delete;
  ~SymbolTables();
  // A return address, looked up one byte before itself, in the call it returns from (a call
  // that ends its function returns past the function's end); the offsets count from it.
  CodeSymbol symbol_of_return_address(const void* address);

 private:
  struct LoadedFile;
  void list_loaded_files();
  bool read(LoadedFile& file);

  LoadedFile* files_ = nullptr;
  size_t file_count_ = 0;
  size_t files_bytes_ = 0;
  bool listed_ = false;
  char executable_[512];  // the executable's path, which the loader leaves empty
};

}  // namespace tray::os
