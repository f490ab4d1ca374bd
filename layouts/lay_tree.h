/* A layout's part as the nested dict its trainer's file holds (layouts/lay_pt_write.c): the keys of the part's
 * prefix split as lay_nest splits them, a node per key component; written as one torch.save file, or as OLMo's
 * safetensors twin (layouts/lay_st_write.c). */
#ifndef FSDP_LAYOUTS_LAY_TREE_H
#define FSDP_LAYOUTS_LAY_TREE_H

#include <stdint.h>

#include "ckpt/pickle.h"
#include "ckpt/pt_write.h"
#include "layouts/layout.h"

typedef struct lay_node {
    char *name;
    int is_int;
    long index;       /* the key as an int when is_int */
    long entry;       /* a leaf: the reader's entry; -1 for a dict */
    size_t parent;
    size_t *kids, n, cap;
} lay_node;

typedef struct lay_tree {
    lay_node *v;
    size_t n, cap;
    long *slot; /* hash of (parent, name) -> node, open addressing; hcap a power of two */
    size_t hcap;
} lay_tree;

/* The tree of part `part`'s keys of r (path: for messages); free with lay_tree_free. */
int lay_tree_build(const lay_layout *L, ckpt_reader *r, size_t part, const char *path, lay_tree *t, fsdp_err *err);
void lay_tree_free(lay_tree *t);
/* 1 when node x is a list of dicts (torch's param_groups: int keys) */
int lay_tree_is_list(const lay_tree *t, const lay_node *x);
/* Node k into the pickle p (root: the part's top: a flat one an OrderedDict); its tensors as records of w (NULL:
 * a tensor is an error). */
int lay_tree_pickle(ptw_file *w, pkl_w *p, lay_tree *t, size_t k, ckpt_reader *r, int root, fsdp_err *err);

#endif
