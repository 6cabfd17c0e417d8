// A plugin opened with RTLD_DEEPBIND, which makes its own dependencies win over the global
// scope when its symbols are resolved. Built twice: without a dependency on traymalloc (its
// malloc and free bind to libc's) and linked against libtraymalloc.so (they bind to ours).
#include <cstdlib>
#include <cstring>

extern "C" char* plugin_strdup(const char* text) { return strdup(text); }
extern "C" void* plugin_malloc(size_t size) { return malloc(size); }
extern "C" void plugin_free(void* p) { free(p); }
