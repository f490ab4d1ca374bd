# make fuzz: libFuzzer harnesses (clang) in build-fuzz/. Run one for 10 minutes with
#   build-fuzz/fuzz_pickle -max_total_time=600 build-fuzz/corpus/pickle tests/fuzz/corpus/pickle
BUILD ?= build-fuzz
CLANG ?= clang
FUZZ_CFLAGS := -g -O1 -std=c11 -D_GNU_SOURCE -Iinclude -I. -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all \
               -DFSDP_HAVE_CUDA=0 -Wno-unknown-pragmas
# every runtime source (the CPU-only variants of the device code): a new file there cannot break the link
FUZZ_LIB_SRCS := $(wildcard ckpt/*.c runtime/*.c train/data*.c tokenizer/*.c) pipeline/value.c pipeline/yaml_load.c pipeline/strmap.c \
                 pipeline/recipe_vars.c pipeline/recipe.c pipeline/recipe_set.c pipeline/recipe_paths.c pipeline/recipe_merge.c pipeline/recipe_when.c \
                 pipeline/recipe_cond.c pipeline/recipe_choices.c pipeline/errlist.c decoder/hf_config.c decoder/hf_config_write.c decoder/decoder_arch.c \
                 model/init_rule.c decoder/decoder_config.c decoder/decoder_moe_config.c decoder/decoder_spec.c decoder/decoder_params.c decoder/decoder_table.c \
                 model/model_table.c model/init_fill.c model/init_sincos.c $(wildcard model/mt_*.c)
FUZZ_LIB_OBJS := $(FUZZ_LIB_SRCS:%.c=$(BUILD)/obj/%.o)
HARNESSES := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS := $(shell mpicc --showme:link 2>/dev/null)

all: $(HARNESSES:%=$(BUILD)/fuzz_%)
.PHONY: all replay

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CLANG) $(FUZZ_CFLAGS) $(MPI_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIB_OBJS)
	$(CLANG) $(FUZZ_CFLAGS) -DFSDP_LIBFUZZER -fsanitize=fuzzer $< $(FUZZ_LIB_OBJS) -ljansson -lpcre2-8 -lunistring -lyaml -lz -ldeflate -lm $(MPI_LIBS) -o $@
.SECONDARY:
-include $(FUZZ_LIB_OBJS:.o=.d)

# Every harness once over its committed corpus (libFuzzer with ASan + UBSan): `make test` runs this
# whenever clang can link -fsanitize=fuzzer, so that the harnesses cannot stop building unnoticed.
replay: all
	@for h in $(HARNESSES); do \
	  $(BUILD)/fuzz_$$h -runs=0 tests/fuzz/corpus/$$h > $(BUILD)/replay_$$h.log 2>&1 || \
	    { cat $(BUILD)/replay_$$h.log; echo "fuzz_$$h: a corpus input fails"; exit 1; }; \
	  echo "fuzz_$$h: $$(tail -1 $(BUILD)/replay_$$h.log)"; \
	done
