/* fsdp-run [--set K=V]... [--dry-run] [--report FILE] [-q|-v] RECIPE.yaml [RECIPE.yaml ...]
 * fsdp-run validate [--set K=V]... RECIPE...
 * fsdp-run stages [--json] [--plugin SO]...
 * fsdp-run --help | --version */
#include "cli/cli.h"
#include "runtime/launch.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/ckpt_cli.h"
#include "cli/plot.h"
#include "cli/data_prepare_cli.h"
#include "cli/tokenize_cli.h"
#include "run/run.h"
#include "pipeline/schema.h"

static void usage(FILE *f) {
    fputs("usage: fsdp-run [options] RECIPE.yaml [RECIPE.yaml ...]   run recipes in sequence in one context\n"
          "       fsdp-run validate [--set K=V]... RECIPE.yaml...   check only (exit 0 valid, 2 invalid)\n"
          "       fsdp-run stages [--json] [--plugin LIB.so]...     list every stage and its parameters\n"
          "       fsdp-run ckpt inspect|convert|diff|clean ...      checkpoint tools (fsdp-run ckpt --help)\n"
          "       fsdp-run plot METRICS.jsonl... -o OUT.png|.svg    loss, lr, grad norm, tokens/s against step\n"
          "       fsdp-run tokenize --tokenizer DIR FILE...         documents -> ids with a model's tokenizer.json\n"
          "       fsdp-run data prepare --tokenizer DIR -o OUT FILE...  documents -> llm.c shards / token file\n"
          "       fsdp-run --help | --version\n"
          "\n"
          "options:\n"
          "  --set KEY=VALUE   override any recipe key (dotted path); stages are addressed by id:\n"
          "                    --set stages.train.with.steps=10. VALUE is read as YAML when it is a flow\n"
          "                    list or map ([1, 2], {a: 1}), a quoted string or a plain scalar YAML reads\n"
          "                    back whole (10, true, null, a path); any other VALUE is kept as written, as\n"
          "                    a string: one holding a newline or ' #' (--set 'vars.out=runs/a #3')\n"
          "  --dry-run         print the execution plan (order, resolved parameters) and exit\n"
          "  --report FILE     write a JSON run report (per stage: status, seconds, metrics, error)\n"
          "  -q, --quiet       warnings and errors only\n"
          "  -v, --verbose     debug messages, from every rank\n"
          "  --nproc N         re-run under the system's mpirun with N local ranks\n"
          "  --fake-nodes K    treat the ranks as K nodes of consecutive ranks (tests of multi-node\n"
          "                    meshes on one machine; sets FSDP_FAKE_NODES=K for every rank)\n"
          "\n"
          "exit codes: 0 success, 1 runtime failure, 2 usage or validation error\n",
          f);
}

static int list_stages(fsdp_registry *reg, int json, FILE *out) {
    if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < registry_count(reg); i++) {
            const fsdp_stage_desc *d = registry_at(reg, i);
            json_t *o = json_object();
            json_object_set_new(o, "name", json_string(d->name));
            json_object_set_new(o, "summary", json_string(d->summary ? d->summary : ""));
            json_object_set_new(o, "origin", json_string(registry_origin(reg, i)));
            json_t *needs = json_array(), *prov = json_array(), *params = json_array();
            for (const char *const *p = d->needs; p && *p; p++) json_array_append_new(needs, json_string(*p));
            for (const char *const *p = d->provides; p && *p; p++) json_array_append_new(prov, json_string(*p));
            for (const fsdp_param_spec *p = d->params; p && p->name; p++) {
                json_t *po = json_object();
                json_object_set_new(po, "name", json_string(p->name));
                json_object_set_new(po, "type", json_string(schema_type_name(p->type)));
                json_object_set_new(po, "required", json_boolean(p->required));
                json_object_set_new(po, "default", p->dflt ? json_string(p->dflt) : json_null());
                if (p->choices) {
                    json_t *c = json_array();
                    for (const char *const *q = p->choices; *q; q++) json_array_append_new(c, json_string(*q));
                    json_object_set_new(po, "choices", c);
                }
                json_object_set_new(po, "help", json_string(p->help ? p->help : ""));
                json_array_append_new(params, po);
            }
            json_object_set_new(o, "needs", needs);
            json_object_set_new(o, "provides", prov);
            json_object_set_new(o, "params", params);
            json_array_append_new(arr, o);
        }
        json_dumpf(arr, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', out);
        json_decref(arr);
        return 0;
    }
    if (registry_count(reg) == 0) fprintf(out, "(no stages registered)\n");
    for (size_t i = 0; i < registry_count(reg); i++) {
        const fsdp_stage_desc *d = registry_at(reg, i);
        fprintf(out, "%s  %s\n", d->name, d->summary ? d->summary : "");
        if (strcmp(registry_origin(reg, i), "built-in")) fprintf(out, "    from: %s\n", registry_origin(reg, i));
        if (d->needs && *d->needs) {
            fprintf(out, "    needs:");
            for (const char *const *p = d->needs; *p; p++) fprintf(out, " %s", *p);
            fputc('\n', out);
        }
        if (d->provides && *d->provides) {
            fprintf(out, "    provides:");
            for (const char *const *p = d->provides; *p; p++) fprintf(out, " %s", *p);
            fputc('\n', out);
        }
        for (const fsdp_param_spec *p = d->params; p && p->name; p++) {
            fprintf(out, "    %-16s %-6s", p->name, schema_type_name(p->type));
            if (p->required) fprintf(out, " required");
            else if (p->dflt) fprintf(out, " = %s", p->dflt);
            if (p->choices) {
                fprintf(out, " (");
                for (const char *const *q = p->choices; *q; q++) fprintf(out, "%s%s", q == p->choices ? "" : "|", *q);
                fprintf(out, ")");
            }
            if (p->help) fprintf(out, "  %s", p->help);
            fputc('\n', out);
        }
    }
    return 0;
}

static int cmd_stages(fsdp_registry *reg, int argc, char **argv, FILE *out, FILE *log) {
    int json = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--plugin") && i + 1 < argc) {
            fsdp_err err;
            if (registry_load_plugin(reg, argv[++i], &err)) {
                fprintf(log, "fsdp-run: error: %s\n", err.msg);
                return 2;
            }
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs("usage: fsdp-run stages [--json] [--plugin LIB.so]...\n", out);
            return 0;
        } else {
            fprintf(log, "fsdp-run stages: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    return list_stages(reg, json, out);
}

int fsdp_cli_run(fsdp_registry *reg, int argc, char **argv, FILE *out, FILE *log) {
    return fsdp_cli_run_comm(reg, argc, argv, out, log, NULL);
}

/* The index of the sub-command (validate, stages, ckpt, plot, tokenize, data) when it is the first word that is
 * neither an option nor an option's value (`fsdp-run -v validate r.yaml`); 0 when there is none (the
 * words are recipes). */
static int find_subcommand(int argc, char **argv) {
    static const char *const SUBS[] = {"validate", "stages", "ckpt", "plot", "tokenize", "data"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--set") || !strcmp(a, "--report") || !strcmp(a, "--nproc")) {
            i++; /* its value */
            continue;
        }
        if (a[0] == '-' && a[1]) continue;
        for (size_t k = 0; k < sizeof SUBS / sizeof *SUBS; k++)
            if (!strcmp(a, SUBS[k])) return i;
        return 0;
    }
    return 0;
}

/* The run command's arguments as parsed: the options, the recipe paths and the --set values. */
typedef struct cli_args {
    run_opts o;
    const char **paths, **sets;
    char **owned; /* recipe paths found in the checkout (cli_recipe_path), freed at the end */
    size_t np;
    int sub;      /* argv index of the command word (validate), or 0 */
    int validate; /* options before `validate` are validate's (--set, -q, -v) */
} cli_args;

/* The value of an option given as `--name=VALUE` (eq: the index of '=') or `--name VALUE`; NULL
 * when it is missing. */
static const char *cli_option_value(const char *a, size_t eq, int argc, char **argv, int *i) {
    return a[eq] == '=' ? a + eq + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
}

/* One argument (argv[*i], which may take the next one): -1 to go on, or the exit status. */
static int cli_parse_arg(cli_args *A, int argc, char **argv, int *i, FILE *out, FILE *log) {
    const char *a = argv[*i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
        usage(out);
        return 0;
    } else if (!strcmp(a, "--version")) {
        fprintf(out, "fsdp-run %s (stage ABI %u.%u, %s)\n", FSDP_VERSION_STRING, FSDP_STAGE_ABI_MAJOR, FSDP_STAGE_ABI_MINOR,
                FSDP_HAVE_CUDA ? "CUDA" : "CPU only");
        return 0;
    } else if (!strcmp(a, "--set") || !strncmp(a, "--set=", 6)) {
        const char *v = cli_option_value(a, 5, argc, argv, i);
        if (!v) {
            fprintf(log, "fsdp-run: error: --set needs KEY=VALUE\n");
            return 2;
        }
        A->sets[A->o.n_sets++] = v;
    } else if (!strcmp(a, "--dry-run") && !A->validate) {
        A->o.dry_run = 1;
    } else if ((!strcmp(a, "--report") || !strncmp(a, "--report=", 9)) && !A->validate) {
        const char *v = cli_option_value(a, 8, argc, argv, i);
        if (!v) {
            fprintf(log, "fsdp-run: error: --report needs a file name\n");
            return 2;
        }
        A->o.report = v;
    } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
        A->o.verbosity = 0;
    } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
        A->o.verbosity = 2;
    } else if (a[0] == '-' && a[1]) {
        fprintf(log, "fsdp-run: error: unknown option '%s' (see fsdp-run --help)\n", a);
        return 2;
    } else {
        char *found = cli_recipe_path(a);
        A->owned[A->np] = found;
        A->paths[A->np++] = found ? found : a;
    }
    return -1;
}

/* Before running: a recipe was given, and a plain run is not one rank of a Slurm job of several
 * tasks. -1 to go on, or the exit status. */
static int cli_check_run(const cli_args *A, comm *cm, FILE *log) {
    if (A->np == 0) {
        fprintf(log, "fsdp-run: error: no recipe given (see fsdp-run --help)\n");
        return 2;
    }
    if (!A->validate && !A->o.dry_run) {
        /* under Slurm with several tasks, a plain fsdp-run would train alone as one rank */
        fsdp_err le;
        if (launch_check_slurm(cm && comm_size(cm) > 1 ? 1 : comm_launched_by_mpi(), &le)) {
            fprintf(log, "fsdp-run: error: %s\n", le.msg);
            return 2;
        }
    }
    return -1;
}

/* The run (or validate) command: its arguments, then the recipes run. */
static int cli_run_recipes(fsdp_registry *reg, int argc, char **argv, int sub, FILE *out, FILE *log, comm *cm) {
    cli_args A;
    memset(&A, 0, sizeof A);
    A.sub = sub;
    A.validate = sub > 0;
    A.o.verbosity = 1;
    A.o.out = out;
    A.o.log = log;
    A.o.validate_only = A.validate;
    A.paths = calloc((size_t)argc, sizeof *A.paths);
    A.sets = calloc((size_t)argc, sizeof *A.sets);
    A.owned = calloc((size_t)argc, sizeof *A.owned);
    if (!A.paths || !A.sets || !A.owned) {
        free(A.paths);
        free(A.sets);
        free(A.owned);
        fprintf(log, "fsdp-run: error: out of memory\n");
        return 1;
    }
    int rc = -1;
    for (int i = 1; i < argc && rc < 0; i++)
        if (i != A.sub) rc = cli_parse_arg(&A, argc, argv, &i, out, log);
    if (rc < 0) rc = cli_check_run(&A, cm, log);
    if (rc < 0) {
        A.o.sets = A.sets;
        A.o.comm = cm;
        rc = run_main(reg, A.paths, A.np, &A.o);
    }
    for (size_t i = 0; i < A.np; i++) free(A.owned[i]);
    free(A.owned);
    free(A.paths);
    free(A.sets);
    return rc;
}

int fsdp_cli_run_comm(fsdp_registry *reg, int argc, char **argv, FILE *out, FILE *log, comm *cm) {
    if (argc < 2) {
        usage(log);
        return 2;
    }
    int sub = find_subcommand(argc, argv);
    if (sub > 1 && strcmp(argv[sub], "validate")) {
        fprintf(log, "fsdp-run: error: option '%s' before `%s`: the %s command takes its options after its name "
                "(fsdp-run %s --help)\n", argv[1], argv[sub], argv[sub], argv[sub]);
        return 2;
    }
    if (sub == 1 && !strcmp(argv[1], "stages")) return cmd_stages(reg, argc - 2, argv + 2, out, log);
    if (sub == 1 && !strcmp(argv[1], "ckpt")) return ckpt_cli_main(argc - 2, argv + 2, out, log);
    if (sub == 1 && !strcmp(argv[1], "plot")) return plot_cli_main(argc - 2, argv + 2, out, log);
    if (sub == 1 && !strcmp(argv[1], "tokenize")) return tokenize_cli_main(argc - 2, argv + 2, out, log);
    if (sub == 1 && !strcmp(argv[1], "data")) return data_cli_main(argc - 2, argv + 2, out, log);
    return cli_run_recipes(reg, argc, argv, sub, out, log, cm);
}

/* --nproc N: re-executes this program under the system's mpirun with N local ranks. */
static int relaunch_mpi(int argc, char **argv, int at, FILE *log) {
    const char *n = argv[at + 1];
    char *end;
    long np = strtol(n, &end, 10);
    if (*end || np < 1 || np > 4096) {
        fprintf(log, "fsdp-run: error: --nproc expects a positive number of ranks, got '%s'\n", n);
        return 2;
    }
    const char *mpirun = getenv("FSDP_MPIRUN");
    if (!mpirun || !*mpirun) mpirun = "mpirun";
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(log, "fsdp-run: error: --nproc: cannot find this executable\n");
        return 1;
    }
    self[len] = '\0';
    char **args = calloc((size_t)argc + 16, sizeof *args);
    if (!args) return 1;
    int k = 0;
    args[k++] = (char *)mpirun;
    args[k++] = "-np";
    args[k++] = (char *)n;
    args[k++] = "--oversubscribe";
    if (geteuid() == 0) args[k++] = "--allow-run-as-root";
    args[k++] = self;
    for (int i = 1; i < argc; i++) {
        if (i == at) {
            i++; /* skip --nproc N */
            continue;
        }
        args[k++] = argv[i];
    }
    args[k] = NULL;
    fflush(NULL);
    execvp(mpirun, args);
    fprintf(log, "fsdp-run: error: --nproc: cannot run %s: %s (install openmpi-bin, or launch with mpirun yourself)\n",
            mpirun, strerror(errno));
    free(args);
    return 1;
}

/* --fake-nodes K: FSDP_FAKE_NODES=K for this process and the ranks --nproc starts (runtime/comm.h:
 * the ranks split into K nodes of consecutive ranks); the two words are taken out of argv. 0 to go
 * on, else the exit status. */
static int take_fake_nodes(int *argc, char **argv) {
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--fake-nodes")) continue;
        const char *k = i + 1 < *argc ? argv[i + 1] : "";
        char *end;
        long n = strtol(k, &end, 10);
        if (!*k || *end || n < 1 || n > 4096) {
            fprintf(stderr, "fsdp-run: error: --fake-nodes expects a positive number of nodes, got '%s'\n", k);
            return 2;
        }
        setenv("FSDP_FAKE_NODES", k, 1);
        memmove(argv + i, argv + i + 2, (size_t)(*argc - i - 2 + 1) * sizeof *argv);
        *argc -= 2;
        i--;
    }
    return 0;
}

int fsdp_cli_main(int argc, char **argv) {
    int frc = take_fake_nodes(&argc, argv);
    if (frc) return frc;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--nproc")) {
            if (comm_launched_by_mpi()) {
                fprintf(stderr, "fsdp-run: error: --nproc inside an MPI job (already launched by mpirun/srun)\n");
                return 2;
            }
            return relaunch_mpi(argc, argv, i, stderr);
        }
    }
    fsdp_registry *reg = registry_new();
    if (!reg) {
        fputs("fsdp-run: error: out of memory\n", stderr);
        return 1;
    }
    fsdp_err err;
    if (registry_add_builtins(reg, &err)) {
        fprintf(stderr, "fsdp-run: error: %s\n", err.msg);
        registry_free(reg);
        return 1;
    }
    comm *cm = NULL;
    if (comm_create(&cm, &err)) {
        fprintf(stderr, "fsdp-run: error: %s\n", err.msg);
        registry_free(reg);
        return 1;
    }
    int rc = fsdp_cli_run_comm(reg, argc, argv, stdout, stderr, cm);
    comm_destroy(cm);
    registry_free(reg);
    return rc;
}
