/* The EOS token a packer puts between documents: named, or tokenizer_config.json's eos_token. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "tok.h"

/* tokenizer_config.json's eos_token ("..." or {"content": "..."}) beside the tokenizer. */
static int eos_from_config(const char *tokenizer, char *out, size_t cap) {
    char path[4200];
    struct stat sb;
    if (stat(tokenizer, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(path, sizeof path, "%s/tokenizer_config.json", tokenizer);
    else {
        const char *slash = strrchr(tokenizer, '/');
        snprintf(path, sizeof path, "%.*stokenizer_config.json", slash ? (int)(slash - tokenizer + 1) : 0, tokenizer);
    }
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je), *e = json_object_get(j, "eos_token");
    const char *s = json_is_string(e) ? json_string_value(e) : json_string_value(json_object_get(e, "content"));
    int ok = s && *s && strlen(s) < cap;
    if (ok) snprintf(out, cap, "%s", s);
    json_decref(j);
    return ok ? 0 : -1;
}

int tok_eos_id(const tok_tokenizer *t, const char *path, const char *name, int32_t *eos, fsdp_err *err) {
    char tok[256];
    if (name && *name) snprintf(tok, sizeof tok, "%s", name);
    else if (eos_from_config(path, tok, sizeof tok))
        return fsdp_err_set(err, FSDP_E_INVALID, "the token between documents is unknown: %s has no tokenizer_config.json "
                            "with an eos_token beside it (name it: data.eos / --eos, e.g. \"<|endoftext|>\")", path);
    *eos = tok_token_id(t, tok);
    if (*eos < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "the EOS token \"%s\" is not in %s's vocabulary", tok, path);
    return 0;
}
