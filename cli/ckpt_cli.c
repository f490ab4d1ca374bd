/* fsdp-run ckpt inspect|convert|diff: checkpoint tools over every readable format. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt/ckpt_stale.h"
#include "ckpt/ckpt_reshard.h"
#include "ckpt/ckpt_stream_out.h"
#include "ckpt/dcp.h"
#include "ckpt/namemap.h"
#include "ckpt/key_layout.h"
#include "ckpt/reader.h"
#include "ckpt/safetensors.h"
#include "cli/ckpt_cli.h"
#include "cli/ckpt_keys.h"
#include "cli/ckpt_tool.h"
#include "cli/ckpt_cli_model.h"
#include "cli/ckpt_convert_moe.h"
#include "cli/ckpt_layout.h"
#include "runtime/crash.h"
#include "runtime/fileio.h"

static void ckpt_usage(FILE *f) {
    fputs("usage: fsdp-run ckpt inspect PATH [--json] [--verify]\n"
          "       fsdp-run ckpt convert SRC DST [--from auto|LAYOUT] [--to dcp|safetensors|LAYOUT] [--names hf|torchtitan]\n"
          "                             [--dtype f32|bf16|f16]\n"
          "                             [--keys GLOB[,GLOB...]]... [--exclude GLOB[,GLOB...]]... [--strip-prefix P]\n"
          "                             [--add-prefix P] [--n-heads H --n-kv-heads K] [--model PRESET|HF_DIR] [--overwrite]\n"
          "                             [--prefixes model=P,optim=P] [--layout torchtitan|keep] [--world M]\n"
          "                             [--hf-config HF_DIR|config.json] [--moe-names mlp|mixtral]\n"
          "                             [--option NAME=VALUE]...\n"
          "       fsdp-run ckpt diff A B [--rtol R] [--atol A] [--round] [--ignore GLOB[,GLOB...]]...\n"
          "                              [--names hf|torchtitan [--n-heads H --n-kv-heads K]] [--layout auto|LAYOUT]\n"
          "       fsdp-run ckpt clean PATH [--dry-run] [--force] [--min-age SECONDS]\n"
          "GLOB: `*` matches within one dotted component, `**` across them (optimizer.**); a pattern\n"
          "without `*` selects the keys it prefixes. --names exports (compares) the model keys only:\n"
          "optimizer.*, train_state.*, lr_scheduler.* and dataloader.* entries are left out and counted.\n"
          "convert --to dcp keeps the non-tensor entries (step, param groups, bytes) byte for byte;\n"
          "safetensors holds tensors only. diff --round compares tensors of different float dtypes after\n"
          "rounding both to the less precise one.\n"
          "PATH: a DCP directory, a .safetensors file, an HF directory (safetensors or pytorch_model*.bin) or its\n"
          "index, or a .pt file.\n"
          "inspect checks the headers and sizes of every record of the data files (exit 1 listing each problem),\n"
          "not the bytes they hold: --verify also checks the CRC-32 of every byte.\n"
          "convert refuses an existing DST (a DCP checkpoint or a file) unless --overwrite, which replaces it\n"
          "atomically: DST holds the old or the new checkpoint at every instant. --model names the model the\n"
          "checkpoint holds (its heads for the q/k permutation); with --to safetensors --names hf the tensors are\n"
          "checked against it and its config.json is written next to DST, so transformers opens the directory.\n"
          "--world M (--to dcp) writes M ranks' data files, each tensor split along dim 0 as FSDP2's Shard(0),\n"
          "the bytes save-dcp on M ranks writes (an N -> M reshard, streamed: memory stays a few MiB).\n"
          "Mixtures of experts: --names torchtitan --to dcp stacks the per-expert HF tensors (mlp.experts.E.*_proj,\n"
          "block_sparse_moe.experts.E.w*) into torchtitan's layers.L.moe.experts.w1|w2|w3 [experts, ...]; --names hf\n"
          "--to safetensors writes them per expert again, under Mixtral's names with --moe-names mixtral or an\n"
          "--hf-config whose model_type is mixtral (its head counts, q/k norm width and DeepSeek-V3 MLA names too).\n"
          "Layouts (LAYOUT: torchtitan-0.2, torchtitan-0.3, ...; inspect names the one it recognises): --from reads\n"
          "SRC in that layout (auto: detected from its keys), --to writes DST in that one (its names, fused\n"
          "tensors, q/k row order and optimizer keys), weights and optimizer moments alike; --from alone writes\n"
          "fsdp-run's own layout (torchtitan-0.2). --to hf exports Hugging Face names (--names hf).\n"
          "--option NAME=VALUE (a Python literal) sets a setting --to's layout keeps in its checkpoint and fsdp-run's\n"
          "lacks (olmo-0.6: max_grad_norm, its TrainConfig's; deepspeed-zero1|2: gradient_clipping, its ds_config's,\n"
          "which DeepSpeed's load takes from the checkpoint); convert says which are missing.\n"
          "--to deepspeed-zero1|deepspeed-zero2 writes DST as DeepSpeed's save_checkpoint does for fp32 training of a\n"
          "transformers Llama on --world N data-parallel ranks (DeepSpeed loads it on N ranks only): DST/latest,\n"
          "DST/global_step<S>/ (mp_rank_00_model_states.pt, zero_pp_rank_R_mp_rank_00_optim_states.pt).\n"
          "diff --layout auto reads both sides in fsdp-run's layout, each from the layout detected (e.g. a\n"
          "torchtitan 0.3 checkpoint against an OLMo-core one; head counts as for convert).\n"
          "inspect, diff and convert's SRC never remove anything: they report the temporaries of saves they find.\n"
          "clean removes what interrupted saves left at PATH, printing each file and why: the temporaries the\n"
          "writers create (*.distcp.tmp, *.metadata.tmp, *.safetensors.tmp, *.safetensors.index.json.tmp) and, in a\n"
          "DCP directory whose .metadata opens, the data files (__R_0.distcp, __R_0.gN.distcp) it does not\n"
          "reference. Nothing else, nothing .metadata references, no temporary whose writer runs on this node; a\n"
          "file modified less than --min-age seconds ago (default 600: a save on another node may be writing it)\n"
          "is kept (exit 1) unless --force. --dry-run lists what would be removed.\n",
          f);
}

static void note_log(void *log, const char *msg) { fprintf(log, "fsdp-run ckpt: %s\n", msg); }

/* Opens path; then reports (never removes: a read-only command cannot tell a save running on another
 * node from an interrupted one) the temporaries of saves there; `ckpt clean` removes them. */
static int open_or_say(const char *path, ckpt_reader **r, FILE *log) {
    fsdp_err err;
    int rc = ckpt_open(path, CKPT_AUTO, r, &err);
    if (rc) fprintf(log, "fsdp-run ckpt: error: %s\n", err.msg);
    else if (ckpt_restarts(*r))
        fprintf(log, "fsdp-run ckpt: %s changed while it was being opened (a save replaced it); reading the new save "
                "(%d restart%s)\n", path, ckpt_restarts(*r), ckpt_restarts(*r) == 1 ? "" : "s");
    ckpt_stale_report(path, note_log, log);
    return rc ? 1 : 0;
}

static int64_t numel_of(const ckpt_entry *e) { return fsdp_numel(e->ndim, e->shape); }

/* One key of `inspect --json`. */
static json_t *entry_json(ckpt_reader *r, const ckpt_entry *e, const char *val) {
    json_t *o = json_object();
    json_object_set_new(o, "key", json_string(e->name));
    if (e->is_tensor) {
        json_object_set_new(o, "dtype", json_string(fsdp_dtype_name(e->dtype)));
        json_t *s = json_array();
        for (int d = 0; d < e->ndim; d++) json_array_append_new(s, json_integer(e->shape[d]));
        json_object_set_new(o, "shape", s);
        json_object_set_new(o, "chunks", json_integer(e->chunks));
        json_object_set_new(o, "bytes", json_integer((json_int_t)e->nbytes));
        /* an alias: its stored pieces are this key's (the bytes are stored once) */
        if (e->is_alias) json_object_set_new(o, "stored_with", json_string(ckpt_entry_at(r, e->alias_of)->name));
    } else {
        json_object_set_new(o, "value", json_string(val));
    }
    return o;
}

/* One key of `inspect`: a tensor's dtype, shape, chunks and bytes (an alias names the key whose
 * stored bytes it shares), or a value. */
static void print_entry(FILE *out, ckpt_reader *r, const ckpt_entry *e, const char *val) {
    if (!e->is_tensor) {
        fprintf(out, "  %-56s = %s\n", e->name, val);
        return;
    }
    char shp[256];
    fsdp_shape_str(e->ndim, e->shape, shp, sizeof shp);
    fprintf(out, "  %-56s %-5s %-16s %3d chunk%s %12llu B", e->name, fsdp_dtype_name(e->dtype), shp, e->chunks,
            e->chunks == 1 ? " " : "s", (unsigned long long)e->nbytes);
    if (e->is_alias) fprintf(out, "  (stored with %s)", ckpt_entry_at(r, e->alias_of)->name);
    fputc('\n', out);
}

/* The structural check of the data files (ckpt_check: every problem, up to CKPT_CHECK_SHOWN, one
 * line each), then with --verify the CRC-32 of every record. Returns 0, or 1 (reported on log). */
static int inspect_check(ckpt_reader *r, const char *path, int verify, ckpt_check_report *rep, size_t *records,
                         FILE *log) {
    fsdp_err err;
    int rc = ckpt_check(r, rep, &err);
    if (rc && !rep->problems) { /* the check could not run */
        fprintf(log, "fsdp-run ckpt: error: %s\n", err.msg);
        return 1;
    }
    if (rc) {
        for (size_t k = 0; k < rep->problems && k < CKPT_CHECK_SHOWN; k++)
            fprintf(log, "fsdp-run ckpt: error: %s\n", rep->shown[k] ? rep->shown[k] : "(out of memory)");
        if (rep->problems > CKPT_CHECK_SHOWN)
            fprintf(log, "fsdp-run ckpt: error: ... and %zu more\n", rep->problems - CKPT_CHECK_SHOWN);
        fprintf(log, "fsdp-run ckpt: error: %s: %zu problem%s in its data files (%zu file%s, %zu records checked)\n",
                path, rep->problems, rep->problems == 1 ? "" : "s", rep->files, rep->files == 1 ? "" : "s",
                rep->records);
        return 1;
    }
    /* --verify: every checksum the format has (the CRC-32 of each record of .pt / .distcp archives) */
    if (verify && ckpt_verify(r, records, &err)) {
        fprintf(log, "fsdp-run ckpt: error: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* What inspect looked at: the check's counts, and whether the bytes themselves were read. */
static void print_checked(FILE *out, ckpt_reader *r, const ckpt_check_report *rep, int verify, size_t records) {
    ckpt_format f = ckpt_reader_format(r);
    if (f == CKPT_SAFETENSORS)
        fprintf(out, "checked: %zu file%s, %zu tensors (the header and each tensor's data_offsets against the file "
                     "size; safetensors carries no checksums)\n",
                rep->files, rep->files == 1 ? "" : "s", rep->records);
    else
        fprintf(out, "checked: %zu data file%s, %zu records (headers and sizes%s)\n", rep->files,
                rep->files == 1 ? "" : "s", rep->records,
                verify ? "" : "; not the bytes: `--verify` also checks the CRC-32 of every byte");
    if (verify && records) fprintf(out, "verified: the CRC-32 of all %zu records matches\n", records);
    else if (verify && f == CKPT_PT)
        fprintf(out, "verified: nothing to check (this torch.save file is of the legacy format of PyTorch < 1.6, "
                     "which carries no checksums)\n");
    else if (verify) fprintf(out, "verified: nothing to check (%s files carry no checksums)\n", ckpt_format_name(f));
}

static json_t *checked_json(const ckpt_check_report *rep, int verify) {
    return json_pack("{s:I,s:I,s:b}", "files", (json_int_t)rep->files, "records", (json_int_t)rep->records, "crc",
                     verify);
}

static int cmd_inspect(int argc, char **argv, FILE *out, FILE *log) {
    const char *path = NULL;
    int json = 0, verify = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--verify")) verify = 1;
        else if (!path) path = argv[i];
        else {
            ckpt_usage(log);
            return 2;
        }
    }
    if (!path) {
        ckpt_usage(log);
        return 2;
    }
    ckpt_reader *r;
    char said[512];
    int special = ckcl_open_inspect(path, &r, said, sizeof said, log);
    if (special == 1 || (!special && open_or_say(path, &r, log))) return 1;
    size_t records = 0;
    ckpt_check_report rep;
    if (inspect_check(r, path, verify, &rep, &records, log)) {
        ckpt_check_report_free(&rep);
        ckpt_close(r);
        return 1;
    }
    size_t n = ckpt_count(r), aliases = 0;
    uint64_t total = 0, stored = 0;
    json_t *arr = json ? json_array() : NULL;
    if (!json) fprintf(out, "%s: %s checkpoint, %zu keys\n", path, ckpt_format_name(ckpt_reader_format(r)), n);
    if (!json && special == 2) fprintf(out, "layout: %s\n", said);
    else if (!json && special == 3) ckcl_print_layout_named(said, out);
    else if (!json) ckcl_print_layout(r, out);
    for (size_t i = 0; i < n; i++) {
        const ckpt_entry *e = ckpt_entry_at(r, i);
        const char *val = NULL;
        fsdp_err verr2;
        if (!e->is_tensor && ckpt_value(r, i, &val, &verr2)) { /* e.g. a global outside the allow-list */
            fprintf(log, "fsdp-run ckpt: error: %s\n", verr2.msg);
            json_decref(arr);
            ckpt_check_report_free(&rep);
            ckpt_close(r);
            return 1;
        }
        if (e->is_tensor) total += e->nbytes;
        if (e->is_tensor && !e->is_alias) stored += e->nbytes;
        if (e->is_alias) aliases++;
        if (json) json_array_append_new(arr, entry_json(r, e, val));
        else print_entry(out, r, e, val);
    }
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "path", json_string(path));
        if (verify) json_object_set_new(o, "verified_records", json_integer((json_int_t)records));
        json_object_set_new(o, "checked", checked_json(&rep, verify));
        json_object_set_new(o, "format", json_string(ckpt_format_name(ckpt_reader_format(r))));
        const char *lname = special == 3 ? said : ckcl_layout_name(r);
        json_object_set_new(o, "layout", lname ? json_string(lname) : json_null());
        json_object_set_new(o, "tensor_bytes", json_integer((json_int_t)total));
        json_object_set_new(o, "stored_tensor_bytes", json_integer((json_int_t)stored));
        json_object_set_new(o, "keys", arr);
        json_dumpf(o, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', out);
        json_decref(o);
    } else {
        fprintf(out, "total tensor bytes: %llu\n", (unsigned long long)total);
        if (aliases)
            fprintf(out, "stored tensor bytes: %llu (%zu key%s stored with another key's bytes)\n",
                    (unsigned long long)stored, aliases, aliases == 1 ? "" : "s");
        print_checked(out, r, &rep, verify, records);
    }
    ckpt_check_report_free(&rep);
    ckpt_close(r);
    return 0;
}

typedef struct conv {
    ckpt_reader *r;
    const char *names, *strip, *add, *model;
    ckpt_keys keys, exclude;
    const char *pre_model, *pre_optim; /* --prefixes model=P,optim=P */
    int relayout;                      /* --layout torchtitan */
    ckl_layout lay;                    /* the source's key layout; lay.model "" unless it is stripped */
    fsdp_dtype dtype;
    int heads, kv_heads;
    decoder_config cfg; /* --model's, when given */
    const char *hf_config, *moe_names; /* --hf-config, --moe-names */
    nmap_hf hf;                        /* the name map's facts (ckcv_facts) */
    const char *from, *to_layout;      /* --from, --to LAYOUT */
    ckpt_reader *canon;                /* the source in fsdp-run's layout (a view under r) */
    char layouts[256];                 /* "A -> B" when a layout was converted */
    const char *group_opt[16];         /* --option NAME=VALUE */
    size_t n_group_opt;
    int ds_stage;                      /* --to deepspeed-zero1|2: the stage */
} conv;

/* output name of input entry i, "" to skip */
static int out_name(const conv *c, const char *in, char *out, size_t cap, nmap_info *info, fsdp_err *err) {
    memset(info, 0, sizeof *info);
    out[0] = '\0';
    if ((c->keys.n && !ckpt_keys_match(&c->keys, in)) || ckpt_keys_match(&c->exclude, in)) return 0;
    if (c->names && ckl_is_training(&c->lay, in)) return 0; /* --names exports the model keys */
    char re[1024];
    if (c->relayout || c->names) { /* into torchtitan's layout: the model prefix off, optimizer. */
        if (ckl_to_torchtitan(&c->lay, in, re, sizeof re, err)) return err->code;
        in = re;
    }
    const char *k = in;
    if (c->strip) {
        const char *s = nmap_strip_prefix(k, c->strip);
        if (s) k = s;
    }
    char tmp[1024];
    if (c->names) {
        nmap_dir dir = !strcmp(c->names, "hf") ? NMAP_TT_TO_HF : NMAP_HF_TO_TT;
        if (nmap_map_hf(dir, k, &c->hf, tmp, sizeof tmp, info, err)) return err->code;
        if (info->dropped) return 0;
        if (info->stacked && dir == NMAP_TT_TO_HF) { /* its parts' names: ckcv_st_declare */
            snprintf(out, cap, "%s", k);
            return 0;
        }
        if (info->qk != NMAP_QK_NONE && c->hf.n_heads <= 0)
            return fsdp_err_set(err, FSDP_E_INVALID, "%s needs the q/k row permutation: pass --n-heads and --n-kv-heads",
                                in);
        k = tmp;
    }
    snprintf(out, cap, "%s%s", c->add ? c->add : "", k);
    return 0;
}

static int read_converted(const conv *c, size_t i, const nmap_info *info, fsdp_dtype dt, void **buf, fsdp_err *err) {
    nmap_dir dir = c->names && !strcmp(c->names, "hf") ? NMAP_TT_TO_HF : NMAP_HF_TO_TT;
    return ckpt_tool_read(c->r, i, dt, dir, info, buf, err);
}

/* fp8 read as a wider float: through the reader, which applies its block scales (ckpt/reader_st.c) */
static int fp8_widened(const conv *c, size_t i) {
    fsdp_dtype d = ckpt_entry_at(c->r, i)->dtype;
    return c->dtype && c->dtype != d && (d == FSDP_DT_F8_E4M3FN || d == FSDP_DT_F8_E5M2);
}

typedef struct conv_out {
    const char *src, *dst, *to;
    char dst_file[4200]; /* --names hf into a directory: DIR/model.safetensors */
    int hf_dir;
    int overwrite;
    int world;              /* --world M (0: not given) */
    size_t written, values; /* tensors, non-tensor entries written */
    uint64_t bytes;
    const char *wrote;      /* what was written, when not `to` ("torch.save files") */
} conv_out;

/* --keys / --exclude GLOBS; 0, or the exit code of a usage error */
static int keys_arg(ckpt_keys *k, const char *opt, const char *v, FILE *log) {
    if (!ckpt_keys_add(k, v)) return 0;
    fprintf(log, "fsdp-run ckpt convert: %s %s: empty pattern or more than %d patterns\n", opt, v, CKPT_KEYS_MAX);
    return 2;
}

/* --prefixes model=P,optim=P (either or both); 0, or the exit code of a usage error */
static int prefixes_arg(conv *c, char *v, FILE *log) {
    for (char *save = NULL, *tok = strtok_r(v, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        const char **dst = NULL;
        if (eq && !strncmp(tok, "model=", 6)) dst = &c->pre_model;
        else if (eq && !strncmp(tok, "optim=", 6)) dst = &c->pre_optim;
        fsdp_err err;
        if (!dst) {
            fprintf(log, "fsdp-run ckpt convert: --prefixes %s: expected model=PREFIX or optim=PREFIX\n", tok);
            return 2;
        }
        if (ckl_prefix_check(dst == &c->pre_model ? "--prefixes model" : "--prefixes optim", eq + 1, &err)) {
            fprintf(log, "fsdp-run ckpt convert: %s\n", err.msg);
            return 2;
        }
        *dst = eq + 1;
    }
    return 0;
}

/* The source's key layout (ckpt/key_layout.h). The model prefix is taken off (with --names or --layout
 * torchtitan) when given, or when every model tensor of the source is under it: an HF checkpoint's
 * model.* keys beside lm_head.weight stay as they are. */
static int convert_layout(conv *c, fsdp_err *err) {
    int rc = ckl_detect(c->r, c->pre_model, c->pre_optim, &c->lay, err);
    if (rc || c->lay.model_given || !c->lay.model[0] || c->strip) {
        if (!rc && !c->lay.model_given) c->lay.model[0] = '\0';
        return rc;
    }
    size_t under = 0, other = 0, ml = strlen(c->lay.model);
    for (size_t i = 0; i < ckpt_count(c->r); i++) {
        const ckpt_entry *e = ckpt_entry_at(c->r, i);
        if (!e->is_tensor || ckl_is_training(&c->lay, e->name)) continue;
        if (!strncmp(e->name, c->lay.model, ml)) under++;
        else other++;
    }
    /* --names torchtitan reads HF names, whose model.* keys are not a prefix to take off */
    if (other || !under || (c->names && !strcmp(c->names, "torchtitan"))) c->lay.model[0] = '\0';
    return 0;
}

/* options of convert into c and o; 0, or the exit code of a usage error */
static int convert_args(int argc, char **argv, conv *c, conv_out *o, FILE *log) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--to") && v && (c->ds_stage = ckcl_deepspeed_stage(v))) i++;
        else if (!strcmp(a, "--to") && v && ckcl_is_layout(v) && strcmp(v, "hf")) c->to_layout = v, i++;
        else if (!strcmp(a, "--to") && v && !strcmp(v, "hf")) c->names = "hf", o->to = "safetensors", i++;
        else if (!strcmp(a, "--to") && v) o->to = v, i++;
        else if (!strcmp(a, "--from") && v) c->from = v, i++;
        else if (!strcmp(a, "--option") && v) {
            if (!strchr(v, '=') || v[0] == '=' || c->n_group_opt == 16) {
                fprintf(log, "fsdp-run ckpt convert: --option %s: expected NAME=VALUE (at most 16)\n", v);
                return 2;
            }
            c->group_opt[c->n_group_opt++] = v, i++;
        }
        else if (!strcmp(a, "--names") && v) c->names = v, i++;
        else if (!strcmp(a, "--dtype") && v) {
            c->dtype = fsdp_dtype_from_name(v);
            i++;
            if (c->dtype != FSDP_DT_F32 && c->dtype != FSDP_DT_BF16 && c->dtype != FSDP_DT_F16) {
                fprintf(log, "fsdp-run ckpt convert: --dtype must be f32, bf16 or f16\n");
                return 2;
            }
        } else if ((!strcmp(a, "--keys") || !strcmp(a, "--exclude")) && v) {
            if (keys_arg(!strcmp(a, "--keys") ? &c->keys : &c->exclude, a, v, log)) return 2;
            i++;
        }
        else if (!strcmp(a, "--strip-prefix") && v) c->strip = v, i++;
        else if (!strcmp(a, "--add-prefix") && v) c->add = v, i++;
        else if (!strcmp(a, "--n-heads") && v) c->heads = atoi(v), i++;
        else if (!strcmp(a, "--n-kv-heads") && v) c->kv_heads = atoi(v), i++;
        else if (!strcmp(a, "--model") && v) c->model = v, i++;
        else if (!strcmp(a, "--hf-config") && v) c->hf_config = v, i++;
        else if (!strcmp(a, "--moe-names") && v) {
            if (strcmp(v, "mlp") && strcmp(v, "mixtral")) {
                fprintf(log, "fsdp-run ckpt convert: --moe-names must be mlp or mixtral\n");
                return 2;
            }
            c->moe_names = v;
            i++;
        }
        else if (!strcmp(a, "--prefixes") && v) {
            if (prefixes_arg(c, argv[i + 1], log)) return 2;
            i++;
        } else if (!strcmp(a, "--layout") && v) {
            if (strcmp(v, "torchtitan") && strcmp(v, "keep")) {
                fprintf(log, "fsdp-run ckpt convert: --layout must be torchtitan or keep\n");
                return 2;
            }
            c->relayout = !strcmp(v, "torchtitan");
            i++;
        }
        else if (!strcmp(a, "--overwrite")) o->overwrite = 1;
        else if (!strcmp(a, "--world") && v) {
            char *end;
            long w = strtol(v, &end, 10);
            if (*end || w < 1 || w > 65536) {
                fprintf(log, "fsdp-run ckpt convert: --world %s: expected a number of ranks from 1 to 65536\n", v);
                return 2;
            }
            o->world = (int)w;
            i++;
        }
        else if (a[0] == '-') {
            fprintf(log, "fsdp-run ckpt convert: unknown option %s\n", a);
            return 2;
        } else if (!o->src) o->src = a;
        else if (!o->dst) o->dst = a;
        else {
            ckpt_usage(log);
            return 2;
        }
    }
    if (!o->src || !o->dst || (o->to && strcmp(o->to, "dcp") && strcmp(o->to, "safetensors")) ||
        (c->names && strcmp(c->names, "hf") && strcmp(c->names, "torchtitan"))) {
        ckpt_usage(log);
        return 2;
    }
    if (!o->to) {
        size_t l = strlen(o->dst);
        o->to = l > 12 && !strcmp(o->dst + l - 12, ".safetensors") ? "safetensors" : "dcp";
    }
    if (c->kv_heads <= 0) c->kv_heads = c->heads;
    if (c->n_group_opt && !c->to_layout && !c->ds_stage) {
        fprintf(log, "fsdp-run ckpt convert: --option sets a setting of --to's layout (olmo-0.6, deepspeed-zero1|2|3), "
                     "and there is no --to LAYOUT\n");
        return 2;
    }
    if (o->world && strcmp(o->to, "dcp")) {
        fprintf(log, "fsdp-run ckpt convert: --world writes a DCP checkpoint (--to dcp), not %s\n", o->to);
        return 2;
    }
    return 0;
}

/* A safetensors file replaces an existing one by rename (st_writer_finish) only with --overwrite. */
static int check_st_dest(const conv_out *o, FILE *log, fsdp_err *err) {
    struct stat st;
    if (lstat(o->dst, &st) != 0) return 0;
    if (S_ISDIR(st.st_mode))
        return fsdp_err_set(err, FSDP_E_INVALID, "%s is a directory, not a .safetensors file (use --to dcp for a DCP "
                            "directory)", o->dst);
    if (!o->overwrite)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s already exists (pass --overwrite to replace it)", o->dst);
    ckpt_stale_sweep(o->dst, note_log, log);
    return 0;
}

/* The tensors being exported under HF names (out_name's) against --model. */
static int check_model(const conv *c, const char *skip, fsdp_err *err) {
    size_t n = ckpt_count(c->r), k = 0;
    ckpt_cli_tensor *t = calloc(n ? n : 1, sizeof *t);
    char (*names)[1024] = calloc(n ? n : 1, sizeof *names);
    int rc = t && names ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        if (skip[i]) continue;
        const ckpt_entry *e = ckpt_entry_at(c->r, i);
        nmap_info ignored;
        if ((rc = out_name(c, e->name, names[k], sizeof names[k], &ignored, err))) break;
        t[k].name = names[k];
        t[k].ndim = e->ndim;
        t[k].shape = e->shape;
        k++;
    }
    if (!rc) rc = ckpt_cli_model_check(&c->cfg, t, k, err);
    free(t);
    free(names);
    return rc ? fsdp_err_prefix(err, "--model %s", c->model) : 0;
}

/* ckcv_read_fn: tensor i whole as dt (no permutation: a stack of experts) */
static int st_read_whole(void *user, size_t i, fsdp_dtype dt, void **buf, fsdp_err *err) {
    const conv *c = user;
    return ckpt_tool_read(c->r, i, dt, NMAP_TT_TO_HF, NULL, buf, err);
}

/* The tensors whose bytes stream (as convert_st's loop would stream them) written in runs of neighbours in the
 * file's order, one ring pass per run (cks_runs_to_st); done[idx] marks the tensors written. */
static int st_stream_runs(const conv *c, st_writer *w, size_t n, const char *skip, const size_t *idx, size_t **pidx,
                          const nmap_info *info, cks_files *fc, const cks_opts *so, const char *what, char *done,
                          fsdp_err *err) {
    cks_st_from *from = calloc(st_writer_count(w) + 1, sizeof *from);
    cks_src *res = calloc(n ? n : 1, sizeof *res);
    char *ok = calloc(n ? n : 1, 1);
    int rc = from && res && ok ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n && !rc && cks_enabled(); i++) {
        if (skip[i] || fp8_widened(c, i) || (!pidx[i] && info[i].qk != NMAP_QK_NONE)) continue;
        const ckpt_entry *e = ckpt_entry_at(c->r, i);
        fsdp_dtype dt = c->dtype ? c->dtype : e->dtype;
        int k = 0;
        if ((rc = cks_src_resolve(c->r, i, fc, &res[i], &k, err)) || !(ok[i] = (char)k)) continue;
        if (!pidx[i]) from[idx[i]] = (cks_st_from){&res[i], 0, res[i].rows, dt};
        for (int64_t q = 0; pidx[i] && q < e->shape[0]; q++) from[pidx[i][q]] = (cks_st_from){&res[i], q, q + 1, dt};
    }
    if (!rc) rc = cks_runs_to_st(w, from, done, what, so, err);
    for (size_t i = 0; res && ok && i < n; i++)
        if (ok[i]) cks_src_free(&res[i]);
    free(from);
    free(res);
    free(ok);
    return rc;
}

/* The directories on the way to a safetensors DST (save-safetensors' rule: with --names hf a path without
 * .safetensors is the export's directory, DST/model.safetensors its file). */
static int st_dest_dirs(conv_out *o, const conv *c, fsdp_err *err) {
    o->hf_dir = st_export_file(o->dst, c->names && !strcmp(c->names, "hf"), o->dst_file, sizeof o->dst_file);
    o->dst = o->dst_file;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", o->dst);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = '\0';
    return st_mkdirs(dir, err);
}

static int convert_to_safetensors(const conv *c, conv_out *o, FILE *log, fsdp_err *err) {
    int rc = st_dest_dirs(o, c, err);
    if (!rc) rc = check_st_dest(o, log, err);
    if (rc) return rc;
    size_t n = ckpt_count(c->r);
    st_writer *w = NULL;
    size_t *idx = calloc(n ? n : 1, sizeof *idx), **pidx = calloc(n ? n : 1, sizeof *pidx);
    nmap_info *info = calloc(n ? n : 1, sizeof *info);
    char *skip = calloc(n ? n : 1, 1);
    if (!idx || !pidx || !info || !skip) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (!rc) rc = st_writer_new(&w, o->dst, err);
    if (!rc) rc = st_writer_set_metadata(w, "format", "pt", err);
    for (size_t i = 0; i < n && !rc; i++) {
        const ckpt_entry *e = ckpt_entry_at(c->r, i);
        char name[1024];
        skip[i] = 1;
        if (!e->is_tensor || (e->fp8_scale && c->dtype)) continue; /* dequantised: the scales are used */
        if ((rc = out_name(c, e->name, name, sizeof name, &info[i], err))) break;
        if (!name[0]) continue;
        skip[i] = 0;
        if (info[i].stacked && !strcmp(c->names, "torchtitan")) {
            rc = fsdp_err_set(err, FSDP_E_INVALID, "%s is expert %d of %s: stacking experts writes a DCP checkpoint "
                              "(--to dcp)", e->name, info[i].part, name);
            break;
        }
        if (info[i].stacked) { /* a stack of experts: one HF tensor per expert */
            rc = ckcv_st_declare(c->r, i, name, &c->hf, c->add, c->dtype ? c->dtype : e->dtype, w, &pidx[i], err);
            continue;
        }
        rc = st_writer_declare(w, name, c->dtype ? c->dtype : e->dtype, e->ndim, e->shape, &idx[i], err);
    }
    if (!rc && c->model && c->names && !strcmp(c->names, "hf")) rc = check_model(c, skip, err);
    if (!rc) rc = st_writer_begin(w, err);
    cks_files fc = {0};
    cks_opts so;
    cks_opts_default(&so);
    char what[4200];
    snprintf(what, sizeof what, "%s.tmp", o->dst);
    char *done = rc ? NULL : calloc(st_writer_count(w) + 1, 1);
    if (!rc && !done) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (!rc) rc = st_stream_runs(c, w, n, skip, idx, pidx, info, &fc, &so, what, done, err);
    for (size_t i = 0; i < n && !rc; i++) {
        if (skip[i]) continue;
        const ckpt_entry *e = ckpt_entry_at(c->r, i);
        fsdp_dtype dt = c->dtype ? c->dtype : e->dtype;
        size_t len = (size_t)numel_of(e) * fsdp_dtype_size(dt);
        if (pidx[i] ? done[pidx[i][0]] : done[idx[i]]) { /* streamed in a run (every part of a stack alike) */
            o->written += pidx[i] ? (size_t)e->shape[0] : 1;
            o->bytes += len;
            continue;
        }
        if (pidx[i]) {
            rc = ckcv_st_write(c->r, i, dt, w, pidx[i], cks_enabled() && !fp8_widened(c, i), st_read_whole, (void *)c,
                               what, &o->bytes, err);
            o->written += (size_t)e->shape[0];
            continue;
        }
        cks_src s;
        int ok = 0;
        if (cks_enabled() && info[i].qk == NMAP_QK_NONE && !fp8_widened(c, i) &&
            (rc = cks_src_resolve(c->r, i, &fc, &s, &ok, err)))
            break;
        if (ok) { /* streamed through a small ring: memory bounded by it, not by the tensor */
            rc = cks_to_st(&s, dt, w, idx[i], what, &so, err);
            cks_src_free(&s);
        } else {
            void *buf;
            if ((rc = read_converted(c, i, &info[i], dt, &buf, err))) break;
            rc = st_writer_write(w, idx[i], buf, len, err);
            free(buf);
        }
        o->written++;
        o->bytes += len;
    }
    cks_files_free(&fc);
    if (!rc) rc = st_writer_finish(w, err);
    if (!rc && c->model && c->names && !strcmp(c->names, "hf")) {
        /* the dtype written: --dtype, else the first tensor's */
        fsdp_dtype dt = c->dtype;
        for (size_t i = 0; i < n && !dt; i++)
            if (!skip[i]) dt = ckpt_entry_at(c->r, i)->dtype;
        rc = ckpt_cli_model_write_config(&c->cfg, dt, o->dst, err);
        if (!rc && o->hf_dir) rc = st_write_index_of(o->dst, err);
    } else if (!rc && c->names && !strcmp(c->names, "hf")) {
        fprintf(log, "fsdp-run ckpt convert: no config.json written (pass --model PRESET|HF_DIR to write one)\n");
    }
    st_writer_free(w);
    free(done);
    for (size_t i = 0; pidx && i < n; i++) free(pidx[i]);
    free(pidx);
    free(idx);
    free(info);
    free(skip);
    return rc;
}

/* ckrs_src callbacks: a tensor streamed unless its rows are permuted (q/k under a name mapping),
 * else read whole with that permutation. */
typedef struct conv_rs {
    const conv *c;
    nmap_info *info; /* by source index */
} conv_rs;

static int rs_can_stream(void *user, size_t i) {
    conv_rs *u = user;
    return cks_enabled() && u->info[i].qk == NMAP_QK_NONE && !fp8_widened(u->c, i);
}

static int rs_read_whole(void *user, size_t i, fsdp_dtype dt, void **buf, fsdp_err *err) {
    conv_rs *u = user;
    return read_converted(u->c, i, &u->info[i], dt, buf, err);
}

/* entries i and j with the same stored pieces convert to the same bytes unless a name mapping
 * permutes the q/k rows of either */
static int rs_same_bytes(void *user, size_t i, size_t j) {
    conv_rs *u = user;
    return u->info[i].qk == NMAP_QK_NONE && u->info[j].qk == NMAP_QK_NONE;
}

/* The entries convert writes (out_name's names) into e / names; *ne of them. */
static int dcp_entries(const conv *c, conv_out *o, ckrs_entry *e, char (*names)[1024], nmap_info *info, size_t *ne,
                       ckcv_stacks *st, fsdp_err *err) {
    size_t n = ckpt_count(c->r);
    *ne = 0;
    for (size_t i = 0; i < n; i++) {
        const ckpt_entry *x = ckpt_entry_at(c->r, i);
        if (!x->is_tensor && c->names) continue; /* --names: the model keys only */
        if (x->fp8_scale && c->dtype) continue;   /* dequantised: the scales are used */
        int rc = out_name(c, x->name, names[*ne], sizeof names[*ne], &info[i], err);
        if (rc) return rc;
        if (!names[*ne][0]) continue;
        if (info[i].stacked && !strcmp(c->names, "hf"))
            return fsdp_err_set(err, FSDP_E_INVALID, "%s is a stack of experts: its per-expert Hugging Face tensors are "
                                "written to safetensors (--to safetensors)", x->name);
        if (info[i].stacked) { /* an expert: part of the stacked tensor names[*ne] (ckcv_stacks_finish) */
            int is_new;
            size_t pos;
            if ((rc = ckcv_stacks_add(st, c->r, names[*ne], info[i].part, i, *ne, &is_new, &pos, err))) return rc;
            e[pos].dt = c->dtype ? c->dtype : x->dtype;
            o->bytes += (uint64_t)numel_of(x) * fsdp_dtype_size(e[pos].dt);
            if (!is_new) continue;
            e[*ne].name = names[*ne];
            o->written++;
            (*ne)++;
            continue;
        }
        e[*ne].i = i;
        e[*ne].name = names[*ne];
        e[*ne].dt = x->is_tensor && c->dtype ? c->dtype : x->dtype;
        ckcl_nest(c->to_layout, names[*ne], &e[*ne]);
        if (x->is_tensor) {
            o->bytes += (uint64_t)numel_of(x) * fsdp_dtype_size(e[*ne].dt);
            o->written++;
        } else {
            o->values++;
        }
        (*ne)++;
    }
    return 0;
}

/* The M data files of generation gen written (a failed one's temporary removed), their records
 * concatenated in rank order into recs (*nr). */
static int write_dcp_files(const ckrs_src *rs, const char *dst, const dcp_gen *gen, int world, dcp_record *recs, size_t *nr,
                           FILE *log, fsdp_err *err) {
    size_t per = rs->n + 2;
    dcp_file_writer *fw = calloc((size_t)world, sizeof *fw);
    dcp_record **rr = calloc((size_t)world, sizeof *rr);
    size_t *nrec = calloc((size_t)world, sizeof *nrec);
    int rc = fw && rr && nrec ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int opened = 0;
    for (; !rc && opened < world; opened++) {
        rr[opened] = recs + (size_t)opened * per;
        if ((rc = dcp_file_open_gen(&fw[opened], dst, opened, gen, note_log, log, err))) break;
    }
    cks_files fc = {0};
    if (!rc) rc = ckrs_write_ranks(rs, 0, world, fw, &fc, rr, nrec, err);
    cks_files_free(&fc);
    for (int r = 0; r < opened; r++) {
        if (!rc) rc = dcp_file_close(&fw[r], err);
        else if (fw[r].f) dcp_file_abort(&fw[r]);
    }
    /* the records of rank r follow rank r-1's (the order save-dcp gathers them in) */
    *nr = 0;
    for (int r = 0; !rc && r < world; r++) {
        memmove(recs + *nr, rr[r], nrec[r] * sizeof *recs);
        *nr += nrec[r];
    }
    free(fw);
    free(rr);
    free(nrec);
    return rc;
}

/* Into a DCP directory of --world M ranks' data files (1 without it): new data files of a fresh
 * generation, .metadata replaced last, then the replaced checkpoint's files removed
 * (ckpt/dcp_commit.c); crash points convert.* and dcp.*. Tensors stream (ckpt/ckpt_reshard.h). */
static int convert_to_dcp(const conv *c, conv_out *o, FILE *log, fsdp_err *err) {
    dcp_gen gen;
    int rc = dcp_prepare_dir(o->dst, o->overwrite, "fsdp-run ckpt convert", "pass --overwrite to replace it", &gen,
                             note_log, log, err);
    if (rc) return rc;
    crash_point("convert.prepared", 1, 0);
    int world = o->world > 0 ? o->world : 1;
    size_t n = ckpt_count(c->r), nr = 0, ne = 0, per = n + 2;
    ckrs_entry *e = calloc(n ? n : 1, sizeof *e);
    char (*names)[1024] = calloc(n ? n : 1, sizeof *names);
    nmap_info *info = calloc(n ? n : 1, sizeof *info);
    dcp_record *recs = calloc(per * (size_t)world, sizeof *recs);
    if (!e || !names || !info || !recs) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    ckcv_stacks st = {0};
    if (!rc) rc = dcp_entries(c, o, e, names, info, &ne, &st, err);
    if (!rc) rc = ckcv_stacks_finish(&st, c->r, &c->hf, e, err);
    conv_rs u = {c, info};
    ckrs_src rs = {c->r, e, ne, world, o->world > 0, o->world > 0, rs_can_stream, rs_read_whole, &u, {0, 0, 0, 0, 0},
                   rs_same_bytes};
    cks_opts_default(&rs.o);
    if (!rc) rc = write_dcp_files(&rs, o->dst, &gen, world, recs, &nr, log, err);
    if (!rc) rc = dcp_write_metadata_gen(o->dst, recs, nr, &gen, err);
    if (!rc) {
        crash_point("convert.committed", 1, 0);
        dcp_remove_old_generations(o->dst, gen.num, world, recs, nr, note_log, log);
    }
    ckcv_stacks_free(&st);
    free(e);
    free(names);
    free(info);
    free(recs);
    return rc;
}

/* What was written, and what was left out and why. */
/* A layout of several DCP directories (accelerate's pytorch_model_fsdp_0 and optimizer_0): each part the keys of its
 * prefix, into DST/<part>. */
/* Part k, a torch.save file (OLMo's model.pt, optim.pt), from the view in its layout: counted as convert_to_dcp counts. */
static int convert_to_pt(conv *c, conv_out *o, size_t k, fsdp_err *err) {
    if (!o->overwrite && access(o->dst, F_OK) == 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s exists (pass --overwrite to replace it)", o->dst);
    for (size_t i = 0; i < ckpt_count(c->r); i++) {
        const ckpt_entry *e = ckpt_entry_at(c->r, i);
        if (!ckpt_keys_match(&c->keys, e->name)) continue;
        if (e->is_tensor) o->written++, o->bytes += e->nbytes;
        else o->values++;
    }
    return ckcl_part_write_pt(c->to_layout, c->r, k, o->dst, err);
}

static int convert_parts_into(conv *c, conv_out *o, const char *dst, FILE *log, fsdp_err *err) {
    char sub[4400];
    int rc = st_mkdirs(dst, err);
    ckpt_keys keep = c->keys;
    size_t written = 0, values = 0;
    uint64_t bytes = 0;
    for (size_t k = 0; k < ckcl_n_parts(c->to_layout) && !rc; k++) {
        const char *name, *prefix;
        ckcl_part(c->to_layout, k, &name, &prefix);
        memset(&c->keys, 0, sizeof c->keys);
        ckpt_keys_add(&c->keys, prefix);
        snprintf(sub, sizeof sub, "%s/%s", dst, name);
        o->dst = sub;
        o->written = o->values = 0, o->bytes = 0;
        if (ckcl_part_is_pt(c->to_layout, k)) {
            rc = convert_to_pt(c, o, k, err);
            o->wrote = "torch.save files";
        } else {
            rc = convert_to_dcp(c, o, log, err);
        }
        written += o->written, values += o->values, bytes += o->bytes;
        ckpt_keys_free(&c->keys);
    }
    c->keys = keep;
    o->written = written, o->values = values, o->bytes = bytes;
    if (!rc) rc = ckcl_side_write(c->to_layout, c->canon, dst, err);
    return rc;
}

/* A layout of several parts (accelerate's DCP directories pytorch_model_fsdp_0 and optimizer_0, OLMo's model.pt and
 * optim.pt) and its side file: each part the keys of its prefix, into DST/<part>. A new DST is staged in DST.partial
 * and renamed at the end, so that a failure leaves no DST that looks like a checkpoint (the stage removed); an
 * existing one (--overwrite) has each part replaced atomically. */
static int convert_to_parts(conv *c, conv_out *o, FILE *log, fsdp_err *err) {
    const char *dst = o->dst;
    char stage[4400];
    int fresh = access(dst, F_OK) != 0;
    snprintf(stage, sizeof stage, "%s.partial", dst);
    if (fresh && access(stage, F_OK) == 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s exists (left by an interrupted convert?): remove it first", stage);
    int rc = convert_parts_into(c, o, fresh ? stage : dst, log, err);
    if (!rc && fresh && rename(stage, dst) != 0)
        rc = fsdp_err_set(err, FSDP_E_IO, "cannot rename %s to %s: %s", stage, dst, strerror(errno));
    if (rc && fresh) fio_remove_tree(stage);
    o->dst = dst;
    return rc;
}

static void convert_report(const conv *c, const conv_out *o, FILE *out) {
    size_t training = 0, values = 0;
    for (size_t i = 0; i < ckpt_count(c->r); i++) {
        const ckpt_entry *e = ckpt_entry_at(c->r, i);
        if ((c->keys.n && !ckpt_keys_match(&c->keys, e->name)) || ckpt_keys_match(&c->exclude, e->name)) continue;
        if (c->names && ckl_is_training(&c->lay, e->name)) training++;
        else if (!e->is_tensor && (c->names || !strcmp(o->to, "safetensors"))) values++;
    }
    fprintf(out, "converted %zu tensors (%.1f MB)", o->written, (double)o->bytes / 1e6);
    if (o->values) fprintf(out, " and %zu non-tensor entries", o->values);
    fprintf(out, " from %s to %s (%s)\n", o->src, o->dst, o->wrote ? o->wrote : o->to);
    if (c->layouts[0]) fprintf(out, "layout: %s\n", c->layouts);
    if (training)
        fprintf(out, "--names %s exports the model keys: left out %zu training entries (optimizer.*, train_state.*, "
                     "lr_scheduler.*, dataloader.*)\n", c->names, training);
    if (values)
        fprintf(out, "left out %zu non-tensor entries (%s)\n", values,
                c->names ? "--names exports the model keys" : "safetensors holds tensors only");
}

/* SRC opened as convert reads it: a DeepSpeed ZeRO directory (in fsdp-run's layout already), a layout's container of
 * parts (its layout the --from), else the checkpoint; checked for placeholders, then seen in --from's layout and
 * --to's. 0 with c->r open, or the exit code with nothing open (the error printed). */
static int convert_source(conv *c, conv_out *o, FILE *log) {
    fsdp_err err;
    int ds = ckcl_is_deepspeed(o->src), rc;
    const char *container = NULL;
    int opened = ds ? ckcl_open_deepspeed(o->src, c->heads, c->kv_heads, &c->r, log)
                    : ckcl_open_container(o->src, &c->r, &container, log);
    if (opened == 0 && !ds && !container) opened = open_or_say(o->src, &c->r, log);
    if (opened) return 1;
    if (container && (!c->from || !strcmp(c->from, "auto"))) c->from = container;
    if (ds) { /* read in fsdp-run's layout already */
        if (c->from && strcmp(c->from, "auto") && strcmp(c->from, "deepspeed-zero")) {
            fprintf(log, "fsdp-run ckpt convert: error: %s is a DeepSpeed ZeRO checkpoint, not --from %s\n", o->src, c->from);
            ckpt_close(c->r);
            return 2;
        }
        snprintf(c->layouts, sizeof c->layouts, "deepspeed-zero -> %s",
                 c->to_layout ? c->to_layout : "torchtitan-0.2 (fsdp-run's own)");
        c->from = c->to_layout ? "torchtitan" : NULL;
    }
    if ((rc = ckcl_check(c->r, &err))) {
        fprintf(log, "fsdp-run ckpt convert: error: %s\n", err.msg);
        ckpt_close(c->r);
        return fsdp_err_exit_code(rc);
    }
    if (!c->from && !c->to_layout) return 0;
    ckcl_req q = {c->from, c->to_layout, c->heads, c->kv_heads, c->group_opt, c->n_group_opt};
    char said[256];
    if ((rc = ckcl_wrap(&c->r, &q, &c->canon, ds ? said : c->layouts, sizeof c->layouts, &err))) {
        fprintf(log, "fsdp-run ckpt convert: error: %s: %s\n", o->src, err.msg);
        return fsdp_err_exit_code(rc); /* closed by the wrap */
    }
    return 0;
}

static int cmd_convert(int argc, char **argv, FILE *out, FILE *log) {
    conv c;
    conv_out o;
    memset(&c, 0, sizeof c);
    memset(&o, 0, sizeof o);
    int rc = convert_args(argc, argv, &c, &o, log);
    if (rc) {
        ckpt_keys_free(&c.keys);
        ckpt_keys_free(&c.exclude);
        return rc;
    }
    fsdp_err err;
    fsdp_err_clear(&err);
    if (c.model) {
        if ((rc = ckpt_cli_model_load(c.model, &c.cfg, &err))) {
            fprintf(log, "fsdp-run ckpt convert: error: %s\n", err.msg);
            ckpt_keys_free(&c.keys);
            ckpt_keys_free(&c.exclude);
            return fsdp_err_exit_code(rc);
        }
        if (c.heads <= 0) c.heads = c.cfg.n_heads, c.kv_heads = c.cfg.n_kv_heads;
    }
    if ((rc = convert_source(&c, &o, log))) {
        ckpt_keys_free(&c.keys);
        ckpt_keys_free(&c.exclude);
        return rc;
    }
    if ((rc = convert_layout(&c, &err)) ||
        (rc = ckcv_facts(c.r, c.heads, c.kv_heads, c.hf_config, c.moe_names, &c.hf, &err))) {
        fprintf(log, "fsdp-run ckpt convert: error: %s: %s\n", o.src, err.msg);
        ckpt_close(c.r);
        ckpt_keys_free(&c.keys);
        ckpt_keys_free(&c.exclude);
        return fsdp_err_exit_code(rc);
    }
    if (c.ds_stage) {
        ckcl_ds_req q = {c.ds_stage, o.world > 0 ? o.world : 1, c.heads, c.kv_heads, c.group_opt, c.n_group_opt,
                         o.overwrite};
        rc = ckcl_write_deepspeed(c.r, &q, o.dst, &o.written, &o.bytes, &err);
        o.wrote = "DeepSpeed ZeRO";
    } else if (c.to_layout && ckcl_n_parts(c.to_layout) && !strcmp(o.to, "dcp")) {
        rc = convert_to_parts(&c, &o, log, &err);
    } else {
        rc = !strcmp(o.to, "safetensors") ? convert_to_safetensors(&c, &o, log, &err) : convert_to_dcp(&c, &o, log, &err);
        if (!rc && c.to_layout && !strcmp(o.to, "dcp")) rc = ckcl_side_write(c.to_layout, c.canon, o.dst, &err);
    }
    if (!rc) convert_report(&c, &o, out);
    ckpt_close(c.r);
    ckpt_keys_free(&c.keys);
    ckpt_keys_free(&c.exclude);
    if (rc) {
        fprintf(log, "fsdp-run ckpt convert: error: %s\n", err.msg);
        return fsdp_err_exit_code(rc);
    }
    return 0;
}

int ckpt_cli_main(int argc, char **argv, FILE *out, FILE *log) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        ckpt_usage(argc < 1 ? log : out);
        return argc < 1 ? 2 : 0;
    }
    if (!strcmp(argv[0], "inspect")) return cmd_inspect(argc - 1, argv + 1, out, log);
    if (!strcmp(argv[0], "diff")) return ckpt_cli_diff(argc - 1, argv + 1, out, log);
    if (!strcmp(argv[0], "convert")) return cmd_convert(argc - 1, argv + 1, out, log);
    if (!strcmp(argv[0], "clean")) return ckpt_cli_clean(argc - 1, argv + 1, out, log);
    fprintf(log, "fsdp-run ckpt: unknown command '%s'\n", argv[0]);
    ckpt_usage(log);
    return 2;
}
