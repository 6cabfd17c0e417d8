/* Leaks from two known sites, and allocates and frees from a third: the leak report of
 * prof_leaks=1 must name leak_buffers and leak_nodes and nothing else (prof_test.py). No
 * stdio: its buffers would be live at exit too. Linked with -rdynamic so that dladdr, which
 * the report uses, sees the functions' names. */
#include <stdlib.h>
#include <string.h>

struct node {
  struct node* next;
  char payload[48];
};

static void* volatile g_sink;

__attribute__((noinline)) void leak_buffers(void) {
  for (int i = 0; i < 2048; ++i) g_sink = malloc(4096); /* 8 MiB, never freed */
}

__attribute__((noinline)) void leak_nodes(void) {
  struct node* list = NULL;
  for (int i = 0; i < 150000; ++i) { /* 8.4 MB in a list nobody frees */
    struct node* n = malloc(sizeof *n);
    n->next = list;
    list = n;
  }
  g_sink = list;
}

__attribute__((noinline)) void churn(void) {
  for (int i = 0; i < 20000; ++i) {
    char* p = malloc(2048);
    memset(p, i, 2048);
    free(p);
  }
}

int main(void) {
  churn();
  leak_buffers();
  leak_nodes();
  churn();
  return 0;
}
