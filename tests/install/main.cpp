// A downstream program built against an installed traymalloc. It checks at run time that its
// malloc and operator new are traymalloc's and that it is linked the way it was built to be.
// Usage: app shared|static
#include <traymalloc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace {

// The file libtraymalloc.so was mapped from, or "" if the process has none.
std::string mapped_traymalloc() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t path = line.find('/');
    if (path != std::string::npos && line.find("libtraymalloc", path) != std::string::npos)
      return line.substr(path);
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || (std::strcmp(argv[1], "shared") != 0 && std::strcmp(argv[1], "static") != 0)) {
    std::fprintf(stderr, "usage: %s shared|static\n", argv[0]);
    return 2;
  }
  const bool want_shared = std::strcmp(argv[1], "shared") == 0;
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "FAIL: %s\n", what);
      ++failures;
    }
  };

  void* block = std::malloc(100);
  auto* text = new std::string(200, 'x');
  check(tray_owns(block) == 1, "malloc is not traymalloc's");
  check(tray_owns(text) == 1 && tray_owns(text->data()) == 1, "operator new is not traymalloc's");
  delete text;
  std::free(block);

  const std::string library = mapped_traymalloc();
  check(library.empty() != want_shared, want_shared ? "libtraymalloc.so is not loaded"
                                                    : "libtraymalloc.so is loaded");
  std::printf("traymalloc %d.%d.%d %s%s%s\n", TRAY_VERSION_MAJOR, TRAY_VERSION_MINOR,
              TRAY_VERSION_PATCH, argv[1], library.empty() ? "" : " from ", library.c_str());
  return failures == 0 ? 0 : 1;
}
