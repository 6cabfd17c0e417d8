// The symbol tables that name the leak report's frames (platform/elf_symbols.cpp): a static
// function of this test program, which is linked without -rdynamic so that dladdr cannot name
// it; an exported function in a shared library, and the name shown of several at one address;
// an address in no file; a library whose file was replaced on disk after it was loaded (its
// build ID differs: the exported names only); and copies of this program broken in the ways a
// file on disk can be, which must be refused or read without a fault.
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "platform/elf_symbols.hpp"

// Internal linkage: a name in .symtab alone, which the tables spell mangled (_ZL: internal).
__attribute__((noinline)) static void* elf_test_return_address() { return __builtin_return_address(0); }
__attribute__((noinline)) static void* elf_test_static_caller() {
  void* address = elf_test_return_address();
  asm volatile("" ::: "memory");  // no tail call: the return address lies in this function
  return address;
}

namespace {

constexpr const char* kStaticCaller = "_ZL22elf_test_static_callerv";

using tray::os::CodeSymbol;
using tray::os::ElfFunctions;
using tray::os::SymbolTables;

// What the loader added to the addresses of the file that holds `address`.
uintptr_t bias_of(const void* address) {
  Dl_info info;
  link_map* map = nullptr;
  if (dladdr1(address, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0 || map == nullptr)
    return 0;
  return map->l_addr;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

std::string executable() {
  char path[4096];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof path);
  return length > 0 ? std::string(path, size_t(length)) : std::string();
}

class ElfSymbols : public testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tray-elf-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    for (const std::string& file : files_) unlink(file.c_str());
    rmdir(dir_.c_str());
  }
  std::string path(const char* name) {
    files_.push_back(dir_ + "/" + name);
    return files_.back();
  }

  std::string dir_;
  std::vector<std::string> files_;
};

TEST_F(ElfSymbols, NamesAStaticFunctionThatDladdrCannot) {
  void* const address = elf_test_static_caller();
  Dl_info info;
  ASSERT_NE(dladdr(address, &info), 0);
  EXPECT_EQ(info.dli_sname, nullptr) << "linked with -rdynamic: " << info.dli_sname;
  SymbolTables symbols;
  const CodeSymbol symbol = symbols.symbol_of_return_address(address);
  ASSERT_NE(symbol.name, nullptr);
  EXPECT_STREQ(symbol.name, kStaticCaller);
  const auto start = reinterpret_cast<uintptr_t>(&elf_test_static_caller);
  EXPECT_EQ(symbol.offset, reinterpret_cast<uintptr_t>(address) - start);
  ASSERT_NE(symbol.file, nullptr);
  EXPECT_EQ(symbol.file, executable());
  EXPECT_EQ(symbol.file_address, reinterpret_cast<uintptr_t>(address) - bias_of(address));
  // A second lookup in the same file reads it no more, and names the same.
  EXPECT_STREQ(symbols.symbol_of_return_address(address).name, kStaticCaller);
}

TEST_F(ElfSymbols, NamesAnExportedFunctionOfALibrary) {
  auto* const function = reinterpret_cast<char*>(dlsym(RTLD_DEFAULT, "dlerror"));
  ASSERT_NE(function, nullptr);
  Dl_info info;
  ASSERT_NE(dladdr(function, &info), 0);
  SymbolTables symbols;
  const CodeSymbol symbol = symbols.symbol_of_return_address(function + 1);
  ASSERT_NE(symbol.name, nullptr);
  EXPECT_EQ(symbol.offset, 1u) << symbol.name;
  EXPECT_STREQ(symbol.file, info.dli_fname);
}

// glibc's getpid is the weak alias of the global __getpid: the public spelling is shown.
TEST_F(ElfSymbols, OfNamesAtOneAddressThePublicOneIsShown) {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  auto* const getpid_in_libc = static_cast<char*>(dlsym(libc, "getpid"));
  dlclose(libc);
  ASSERT_NE(getpid_in_libc, nullptr);
  SymbolTables symbols;
  EXPECT_STREQ(symbols.symbol_of_return_address(getpid_in_libc + 1).name, "getpid");
}

TEST_F(ElfSymbols, AnAddressInNoFileHasNoNameAndNoFile) {
  char on_stack[16] = {};
  SymbolTables symbols;
  const CodeSymbol symbol = symbols.symbol_of_return_address(on_stack + 1);
  EXPECT_EQ(symbol.file, nullptr);
  EXPECT_EQ(symbol.name, nullptr);
}

// A file replaced on disk (a package upgraded under a running program) would name other
// functions: its build ID differs from the loaded one's, and dladdr names the exports instead.
TEST_F(ElfSymbols, AFileReplacedSinceItWasLoadedIsNotRead) {
  // The C++ runtime's libm, found by name: the sanitizers' runtimes define frexp themselves.
  void* libm = dlopen("libm.so.6", RTLD_NOW | RTLD_NOLOAD);
  link_map* libm_map = nullptr;
  ASSERT_NE(libm, nullptr);
  ASSERT_EQ(dlinfo(libm, RTLD_DI_LINKMAP, &libm_map), 0);
  const std::string copy = path("libm-copy.so"), replacement = path("replacement");
  write_file(copy, read_file(libm_map->l_name));
  dlclose(libm);
  void* handle = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  // Not an IFUNC (cos is one): dlsym gives the exported function itself, which dladdr names.
  auto* const frexp = static_cast<char*>(dlsym(handle, "frexp"));
  ASSERT_NE(frexp, nullptr);
  Dl_info exported;
  ASSERT_NE(dladdr(frexp, &exported), 0);
  ASSERT_NE(exported.dli_sname, nullptr);
  write_file(replacement, read_file("/proc/self/exe"));
  ASSERT_EQ(rename(replacement.c_str(), copy.c_str()), 0);  // the mapping keeps the old file
  {
    SymbolTables symbols;
    const CodeSymbol symbol = symbols.symbol_of_return_address(frexp + 1);
    ASSERT_NE(symbol.name, nullptr);
    EXPECT_STREQ(symbol.name, exported.dli_sname);
    EXPECT_EQ(symbol.offset, 1u);
    EXPECT_STREQ(symbol.file, copy.c_str());
  }
  dlclose(handle);
}

// --- one file, as it may lie on disk ------------------------------------------------------

struct Sections {
  Elf64_Ehdr* header;
  Elf64_Shdr* sections;
  Elf64_Shdr* symtab;
};

Sections sections_of(std::string& file) {
  auto* header = reinterpret_cast<Elf64_Ehdr*>(file.data());
  auto* sections = reinterpret_cast<Elf64_Shdr*>(file.data() + header->e_shoff);
  Elf64_Shdr* symtab = nullptr;
  for (size_t i = 0; i < header->e_shnum; ++i)
    if (sections[i].sh_type == SHT_SYMTAB) symtab = &sections[i];
  return {header, sections, symtab};
}

// The static function's address as this program's file counts it.
uintptr_t static_caller_in_file() {
  const auto start = reinterpret_cast<uintptr_t>(&elf_test_static_caller);
  return start - bias_of(reinterpret_cast<void*>(start));
}

TEST_F(ElfSymbols, ReadsThisProgramsFile) {
  ElfFunctions functions;
  ASSERT_TRUE(functions.open("/proc/self/exe"));
  uintptr_t start = 0;
  EXPECT_STREQ(functions.function_at(static_caller_in_file() + 2, &start), kStaticCaller);
  EXPECT_EQ(start, static_caller_in_file());
  size_t id_bytes = 0;
  EXPECT_NE(functions.build_id(&id_bytes), nullptr);
  EXPECT_GT(id_bytes, 0u);
  EXPECT_EQ(functions.function_at(0, &start), nullptr);
  functions.close();
  EXPECT_EQ(functions.function_at(static_caller_in_file(), &start), nullptr);
}

TEST_F(ElfSymbols, RefusesWhatIsNoReadableElfFile) {
  const std::string program = read_file("/proc/self/exe");
  ASSERT_GT(program.size(), sizeof(Elf64_Ehdr));
  const std::string text = path("text"), header = path("header"), half = path("half"), empty = path("empty");
  write_file(text, std::string(4096, 'x'));
  write_file(header, program.substr(0, sizeof(Elf64_Ehdr)));
  write_file(half, program.substr(0, program.size() / 2));  // the section headers are at the end
  write_file(empty, "");
  ElfFunctions functions;
  for (const std::string& file : {text, header, half, empty, dir_, dir_ + "/missing"})
    EXPECT_FALSE(functions.open(file.c_str())) << file;

  std::string wrong = program;
  Sections parts = sections_of(wrong);
  const uint64_t section_offset = parts.header->e_shoff;
  for (const uint64_t offset : {section_offset + 1, uint64_t(program.size()), UINT64_MAX - 7}) {
    parts.header->e_shoff = offset;
    write_file(path("sections"), wrong);
    EXPECT_FALSE(functions.open(files_.back().c_str())) << offset;
  }
  parts.header->e_shoff = section_offset;
  parts.header->e_ident[EI_CLASS] = ELFCLASS32;
  write_file(path("class32"), wrong);
  EXPECT_FALSE(functions.open(files_.back().c_str()));
}

// A .symtab that cannot be read is passed over for .dynsym, which this program's static
// function is not in.
TEST_F(ElfSymbols, ABrokenSymbolTableLeavesTheDynamicOne) {
  const std::string program = read_file("/proc/self/exe");
  ElfFunctions functions;
  uintptr_t start = 0;
  const uintptr_t address = static_caller_in_file() + 2;
  auto damaged = [&](const char* name, void (*damage)(Sections&)) {
    std::string copy = program;
    Sections parts = sections_of(copy);
    EXPECT_NE(parts.symtab, nullptr);
    if (parts.symtab == nullptr) return;
    damage(parts);
    write_file(path(name), copy);
    EXPECT_TRUE(functions.open(files_.back().c_str())) << name;
    EXPECT_EQ(functions.function_at(address, &start), nullptr) << name;
    functions.close();
  };
  damaged("offset", [](Sections& s) { s.symtab->sh_offset = UINT64_MAX - 100; });
  damaged("size", [](Sections& s) { s.symtab->sh_size = UINT64_MAX - 7; });
  damaged("entry", [](Sections& s) { s.symtab->sh_entsize = 1; });
  damaged("link", [](Sections& s) { s.symtab->sh_link = s.header->e_shnum; });
  damaged("strings", [](Sections& s) {
    Elf64_Shdr& strings = s.sections[s.symtab->sh_link];
    reinterpret_cast<char*>(s.header)[strings.sh_offset + strings.sh_size - 1] = 'x';  // no NUL
  });
  damaged("type", [](Sections& s) { s.symtab->sh_type = SHT_PROGBITS; });
}

// More sections than e_shnum counts: 0 there, and the first section header's size says how many.
TEST_F(ElfSymbols, ReadsTheSectionCountFromTheFirstSection) {
  std::string copy = read_file("/proc/self/exe");
  Sections parts = sections_of(copy);
  parts.sections[0].sh_size = parts.header->e_shnum;
  parts.header->e_shnum = 0;
  write_file(path("extended"), copy);
  ElfFunctions functions;
  ASSERT_TRUE(functions.open(files_.back().c_str()));
  uintptr_t start = 0;
  EXPECT_STREQ(functions.function_at(static_caller_in_file() + 2, &start), kStaticCaller);
}

}  // namespace
