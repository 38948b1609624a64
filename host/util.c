/* Small helpers shared by the core. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void ah__list_init(ah__link *head) {
  head->prev = head;
  head->next = head;
}

bool ah__list_empty(const ah__link *head) {
  return head->next == head;
}

void ah__list_push(ah__link *head, ah__link *node) {
  node->prev = head->prev;
  node->next = head;
  head->prev->next = node;
  head->prev = node;
}

void ah__list_remove(ah__link *node) {
  if (!node->next || node->next == node)
    return;
  node->prev->next = node->next;
  node->next->prev = node->prev;
  node->prev = node;
  node->next = node;
}

char *ah__strdup(const char *s) {
  return s ? strdup(s) : NULL;
}
