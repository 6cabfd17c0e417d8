/* Leaks from two known sites, and allocates and frees from a third: the leak report of
 * prof_leaks=1 must name both leaking stacks and nothing else (prof_test.py). No stdio: its
 * buffers would be live at exit too. Every function but main is static and the program is
 * linked without -rdynamic, as most programs are: their names are in the symbol table alone
 * (.symtab), which dladdr does not read. The list's leak is three static frames deep. */
#include <stdlib.h>
#include <string.h>

struct node {
  struct node* next;
  char payload[48];
};

static void* volatile g_sink;
static struct node* volatile g_list;

__attribute__((noinline)) static void leak_buffers(void) {
  for (int i = 0; i < 2048; ++i) g_sink = malloc(4096); /* 8 MiB, never freed */
}

/* No arguments, so that the compiler makes no specialised copy (new_node.constprop.0). */
__attribute__((noinline)) static struct node* new_node(void) {
  struct node* n = malloc(sizeof *n);
  n->payload[0] = 1;
  return n;
}

__attribute__((noinline)) static void grow_list(void) {
  struct node* n = new_node();
  n->next = g_list;
  g_list = n;
}

__attribute__((noinline)) static void leak_nodes(void) {
  for (int i = 0; i < 150000; ++i) grow_list(); /* 8.4 MB in a list nobody frees */
}

__attribute__((noinline)) static void churn(void) {
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
