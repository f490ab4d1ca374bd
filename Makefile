# fsdp-run: one non-recursive build.
#
#   make               build build/fsdp-run (+ example plugins)
#   make test          build and run the whole test suite (TEST_OPT: the test files' -O and -g, -Og -g1)
#   make setup         install the system packages (apt) and build
#   make asan          build and run the tests under ASan + UBSan (in build-asan/)
#   make fuzz          build the libFuzzer harnesses (clang) in build-fuzz/
#   make bench         build the benchmarks
#   make bundle        build/bundle/: the binary and its non-system shared libraries
#   make CUDA=0        force a CPU-only build, in build-nocuda/ (CUDA is used whenever nvcc is found)
#   make BUILD=dir     build into another directory
#   make emu           the emulated-device build in build-emu/ (needs nvcc's headers only): fsdp-run, the
#                      plugins and the tests with FSDP_HAVE_CUDA=1 against the fake CUDA runtime, cuBLASLt
#                      and NCCL of tests/emu/ (see tests/emu/emu_cudart.cc), so the GPU code runs on the CPU
#   make test-emu      build it and run the GPU test suites in it (`make test` does too when nvcc exists)

# As many jobs as the machine has cores unless the caller gave -j (a fresh clone's `make test` and .ci/run build
# in parallel; the CPU suite and the emulated quick suite run side by side, see `test:`).
ifeq ($(filter -j%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif

CUDA ?= auto
EMU ?= 0
# a CPU-only build keeps its objects apart from the CUDA build's
ifeq ($(CUDA),0)
  BUILD ?= build-nocuda
else ifeq ($(EMU),1)
  BUILD ?= build-emu
else
  BUILD ?= build
endif
CC ?= gcc
CXX ?= g++
CLANG ?= clang

NVCC_FOUND := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(CUDA),0)
  HAVE_CUDA := 0
else ifneq ($(NVCC_FOUND),)
  HAVE_CUDA := 1
  NVCC ?= $(NVCC_FOUND)
else
  HAVE_CUDA := 0
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC_FOUND))

MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
# cairo draws `fsdp-run plot` (libcairo2-dev, tools/setup.sh)
CAIRO_CFLAGS := $(shell pkg-config --cflags cairo 2>/dev/null)
CAIRO_LIBS   := $(or $(shell pkg-config --libs cairo 2>/dev/null),-lcairo)

SAN_FLAGS ?=
OPT ?= -O2
WARN := -Wall -Wextra -Werror -Wno-format-truncation
CPPFLAGS += -Iinclude -I. -D_GNU_SOURCE $(MPI_CFLAGS) $(BLAS_CFLAGS) \
            -DFSDP_HAVE_CUDA=$(HAVE_CUDA) -DFSDP_BUILD_DIR=\"$(BUILD)\"
CFLAGS   += -std=c11 $(OPT) -g $(WARN) -fopenmp -fPIC $(SAN_FLAGS) -MMD -MP
CXXFLAGS += -std=c++17 $(OPT) -g $(WARN) -fopenmp $(SAN_FLAGS) -MMD -MP
LDLIBS   += -lyaml -ljansson -lpcre2-8 -lunistring -lopenblas -lz -ldeflate -ldl -lm -lpthread $(MPI_LIBS) $(CAIRO_LIBS)
LDFLAGS  += -fopenmp $(SAN_FLAGS) -rdynamic

ifeq ($(EMU),1)
  ifneq ($(HAVE_CUDA),1)
    $(error make EMU=1 needs the CUDA headers (nvcc was not found))
  endif
  # the fakes replace libcudart and libnccl (linked in) and cuBLAS(Lt) (dlopened by name from $(BUILD)/lib,
  # the executables' RPATH, which the loader searches before LD_LIBRARY_PATH and the system)
  # NCCL's fake is linked in: runtime/nccl_api.c takes its functions' addresses instead of dlopening it
  CPPFLAGS += -I$(CUDA_HOME)/include -DFSDP_NCCL_LINKED=1
  CUBLAS_MAJOR := $(shell sed -n 's/^\#define CUBLAS_VER_MAJOR \([0-9]*\).*/\1/p' $(CUDA_HOME)/include/cublas_api.h)
  EMU_LIBDIR := $(abspath $(BUILD)/lib)
  EMU_SOS := $(BUILD)/lib/libcublasLt.so.$(CUBLAS_MAJOR) $(BUILD)/lib/libcublas.so.$(CUBLAS_MAJOR)
  LDLIBS += -lstdc++
  LDFLAGS += -Wl,--disable-new-dtags,-rpath,$(EMU_LIBDIR)
else ifeq ($(HAVE_CUDA),1)
  CPPFLAGS += -I$(CUDA_HOME)/include
  NVCCFLAGS ?= -O3 -arch=sm_90 -std=c++17 -Xcompiler -fPIC,-Wall -Iinclude -I. -DFSDP_HAVE_CUDA=1 \
               --expt-relaxed-constexpr -lineinfo
  # -lstdc++: the host code nvcc generates for kernels needs the C++ runtime; executables link with $(CC).
  # The CUDA runtime is linked statically (nvcc's own default, and how cuBLAS and NCCL carry theirs): no
  # libcudart.so is mapped at start-up, and the runtime loads the driver (libcuda) only at its first call,
  # which a CPU run or `validate` never makes. NCCL and cuBLAS are not linked: runtime/nccl_api.c and
  # runtime/device_blas.c dlopen them when a GPU is used (the RPATH finds them).
  LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -lrt -lstdc++
endif

# --- sources -----------------------------------------------------------------
# the rooms, top to bottom (README "Layout"; tests/test_layers.cc keeps it): cli, run, stages, api (the plugin
# API), train, decoder, model, pipeline, ckpt and kernels, runtime, include
LIB_C_SRCS := $(filter-out cli/main.c,$(wildcard cli/*.c run/*.c stages/*.c api/*.c train/*.c decoder/*.c model/*.c \
               pipeline/*.c layouts/*.c ckpt/*.c tokenizer/*.c kernels/cpu/*.c kernels/cuda/*.c runtime/*.c))
CU_SRCS    := $(if $(filter 1,$(HAVE_CUDA)),$(if $(filter 1,$(EMU)),,$(wildcard kernels/cuda/*.cu)))
# the emulated-device build: the fake runtime, NCCL and the kernels compiled as host C++ (tests/emu/)
EMU_SRCS   := $(if $(filter 1,$(EMU)),tests/emu/emu_cudart.cc tests/emu/emu_kernels.cc tests/emu/emu_nccl.cc)
TEST_SRCS  := $(wildcard tests/*.cc) $(if $(filter 1,$(EMU)),$(wildcard tests/emu/test_*.cc))
FUZZ_SRCS  := $(wildcard tests/fuzz/fuzz_*.c)
PLUGIN_SRCS := $(wildcard examples/plugins/*.c)
TEST_PLUGIN_SRCS := $(wildcard tests/plugins/*.c)
TEST_MPI_SRCS := $(wildcard tests/mpi/*.c)
BENCH_SRCS := $(wildcard bench/*.c)

LIB_OBJS  := $(LIB_C_SRCS:%.c=$(BUILD)/obj/%.o) $(CU_SRCS:%.cu=$(BUILD)/obj/%.cu.o) $(EMU_SRCS:%.cc=$(BUILD)/obj/%.o)
TEST_OBJS := $(TEST_SRCS:%.cc=$(BUILD)/obj/%.o) $(FUZZ_SRCS:%.c=$(BUILD)/obj/%.o)
LIBFSDP   := $(BUILD)/libfsdp.a
BIN       := $(BUILD)/fsdp-run
TEST_BIN  := $(BUILD)/tests/fsdp_tests
PLUGINS   := $(PLUGIN_SRCS:examples/plugins/%.c=$(BUILD)/plugins/lib%.so)
TEST_PLUGINS := $(TEST_PLUGIN_SRCS:tests/plugins/%.c=$(BUILD)/tests/plugins/lib%.so)
TEST_MPI_BINS := $(TEST_MPI_SRCS:tests/mpi/%.c=$(BUILD)/tests/mpi/%)
BENCHES   := $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%)

# Executables take the whole library so that plugins (dlopen) resolve every public symbol.
WHOLE_LIB := -Wl,--whole-archive $(LIBFSDP) -Wl,--no-whole-archive
# The link flags as last used: executables are linked again when they change (a library added or
# linked another way), not only when an object file does.
LINK_FLAGS := $(BUILD)/link.flags

.PHONY: all test setup asan fuzz bench bundle gpu-kit clean check-deps emu test-emu test-emu-run FORCE
all: $(BIN) $(PLUGINS) $(EMU_SOS)

$(LINK_FLAGS): FORCE
	@mkdir -p $(dir $@)
	@echo '$(LDFLAGS) $(LDLIBS)' | cmp -s - $@ || echo '$(LDFLAGS) $(LDLIBS)' > $@

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

# The RNG fill loops vectorise only without errno handling of sqrtf and with FP compares treated
# as non-trapping (neither changes a value).
$(BUILD)/obj/runtime/rng.o: CFLAGS += -fno-math-errno -fno-trapping-math
# The AdamW loop likewise (sqrt's argument is never negative) and with the dynamic cost model, without which
# gcc 12 at -O2 does not vectorise a loop with double division and sqrt (kernels/cpu/kc_adamw.c).
$(BUILD)/obj/kernels/cpu/kc_adamw.o: CFLAGS += -fno-math-errno -fvect-cost-model=dynamic
$(BUILD)/obj/cli/plot_draw.o $(BUILD)/obj/tests/test_observe.o: CPPFLAGS += $(CAIRO_CFLAGS)

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/obj/tests/%.o: tests/%.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@

# The test files themselves (not the emulated runtime and kernels beside them, which stay at $(OPT) -g)
# compile at -Og with line tables only: a third of the time of -O2 -g (measured 2026-12-01: 8.2 s -> 3.0 s
# for tests/test_harden_dcp.cc), where a fresh clone's `make test` spends most of its build; what they test
# is the library, built at $(OPT). TEST_OPT='-O2 -g' for full debug information in a test.
TEST_OPT ?= -Og -g1
TEST_CXXFLAGS := $(filter-out $(OPT) -g,$(CXXFLAGS)) $(TEST_OPT)
# and with tests/test_pch.h precompiled for them (its copy in $(BUILD)/pch, where g++ looks for the .gch:
# 3.0 s -> 2.4 s for tests/test_harden_dcp.cc); the same flags as theirs, or g++ ignores it
TEST_PCH := $(BUILD)/pch/test_pch.h
TEST_PCH_OBJS := $(filter $(BUILD)/obj/tests/test_% $(BUILD)/obj/tests/emu/test_%,$(TEST_OBJS))
$(TEST_PCH_OBJS): CXXFLAGS := $(TEST_CXXFLAGS) -include $(TEST_PCH)
$(TEST_PCH_OBJS): $(TEST_PCH).gch
$(TEST_PCH): tests/test_pch.h
	@mkdir -p $(dir $@)
	cp $< $@
$(TEST_PCH).gch: $(TEST_PCH)
	$(CXX) $(CPPFLAGS) $(TEST_CXXFLAGS) -x c++-header $< -o $@

$(LIBFSDP): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

ifeq ($(EMU),1)
$(BUILD)/lib/libcublasLt.so.$(CUBLAS_MAJOR): tests/emu/emu_cublaslt.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -MF $(BUILD)/lib/emu_cublaslt.d -fPIC -shared -Wl,-soname,$(notdir $@) $< -o $@

$(BUILD)/lib/libcublas.so.$(CUBLAS_MAJOR): tests/emu/emu_cublas.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -MF $(BUILD)/lib/emu_cublas.d -fPIC -shared -Wl,-soname,$(notdir $@) $< -o $@
endif

$(BIN): $(BUILD)/obj/cli/main.o $(LIBFSDP) $(LINK_FLAGS) | $(EMU_SOS)
	$(CC) $(LDFLAGS) $< $(WHOLE_LIB) $(LDLIBS) -o $@

$(BUILD)/plugins/lib%.so: examples/plugins/%.c include/fsdp/*.h
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -shared $< -o $@

$(BUILD)/tests/plugins/lib%.so: tests/plugins/%.c include/fsdp/*.h
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -shared $< -o $@

$(BUILD)/tests/mpi/%: tests/mpi/%.c $(LIBFSDP) $(LINK_FLAGS) | $(EMU_SOS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) $< $(WHOLE_LIB) $(LDLIBS) -o $@

$(TEST_BIN): $(TEST_OBJS) $(LIBFSDP) $(LINK_FLAGS) | $(EMU_SOS)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $(TEST_OBJS) $(WHOLE_LIB) -lgtest -lgtest_main $(LDLIBS) -o $@

$(BUILD)/bench/%: bench/%.c $(LIBFSDP) $(LINK_FLAGS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) $< $(WHOLE_LIB) $(LDLIBS) -o $@

bench: $(BIN) $(BENCHES)

# The suite runs from the project root; fixtures are read from ../shared/fixtures.
# True when clang links libFuzzer harnesses (the fuzz replay of `make test` needs it).
FUZZ_PROBE = echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return (int)(d[0] * 0) + (int)n * 0; }' | \
	$(CLANG) -x c - -fsanitize=fuzzer -o /dev/null 2>/dev/null
# With CUDA headers the emulated build (then the fuzz harnesses' build) compiles beside the CPU suite, at a lower priority (nice): it takes
# the cores the suite leaves idle (waiting on mpirun, the disk, its timeouts).
# The suite then runs with one OpenBLAS thread: OpenBLAS's own threads wait by sched_yield(), which hands their
# cores to the niced build (the quickstart end-to-end test took 90 s there against 19 s alone; 28-34 s so).
# Once built, the emulated quick suite runs there too (nice -n 10, its output kept in $(BUILD)/emu-test.log and
# shown after the CPU suite's): the CPU suite runs one test at a time and leaves a core idle for minutes.
test: $(BIN) $(PLUGINS) $(TEST_PLUGINS) $(TEST_MPI_BINS) $(TEST_BIN)
ifeq ($(HAVE_CUDA)$(EMU)$(SAN_FLAGS),10)
	@rm -f $(BUILD)/emu-build.rc $(BUILD)/emu-test.rc; ( nice -n 15 $(MAKE) --no-print-directory emu > $(BUILD)/emu-build.log 2>&1; \
	  echo $$? > $(BUILD)/emu-build.rc; \
	  if $(FUZZ_PROBE); then nice -n 15 $(MAKE) --no-print-directory -f tests/fuzz/fuzz.mk BUILD=build-fuzz all \
	    > $(BUILD)/fuzz-build.log 2>&1 || true; fi; \
	  if [ "$$(cat $(BUILD)/emu-build.rc)" = 0 ]; then OPENBLAS_NUM_THREADS=1 nice -n 10 $(MAKE) --no-print-directory EMU=1 test-emu-run \
	    EMU_SUITES='$(EMU_QUICK)' > $(BUILD)/emu-test.log 2>&1; echo $$? > $(BUILD)/emu-test.rc; fi ) & \
	OPENBLAS_NUM_THREADS=1 FSDP_RUN_BIN=$(BIN) FSDP_PLUGIN_DIR=$(BUILD)/plugins OMP_NUM_THREADS=2 $(TEST_BIN) $(GTEST_ARGS); rc=$$?; \
	wait; if [ "$$(cat $(BUILD)/emu-build.rc 2>/dev/null)" != 0 ]; then cat $(BUILD)/emu-build.log; \
	  echo "test: the emulated build failed (its log above)"; exit 1; fi; \
	echo "test: the emulated-GPU quick suite (run beside the CPU suite):"; cat $(BUILD)/emu-test.log; \
	if [ "$$(cat $(BUILD)/emu-test.rc 2>/dev/null)" != 0 ]; then echo "test: the emulated-GPU suite failed (above)"; exit 1; fi; \
	exit $$rc
else
	FSDP_RUN_BIN=$(BIN) FSDP_PLUGIN_DIR=$(BUILD)/plugins OMP_NUM_THREADS=2 $(TEST_BIN) $(GTEST_ARGS)
endif
ifeq ($(EMU)$(SAN_FLAGS),0)
	@if $(FUZZ_PROBE); then \
	  $(MAKE) -f tests/fuzz/fuzz.mk BUILD=build-fuzz replay; \
	else echo "test: the fuzz harnesses were not built: $(CLANG) with libFuzzer is not installed (make fuzz installs it)"; fi
endif

# The GPU suites (their tests skip in a build without a GPU) run in the emulated-device build.
EMU_SUITES := EmuCudart*:HfGridGpu*:PadTokenGpu*:CudaMoe*:MoeCuda*:HsdpGpu*:PluginApiGpu*:ModelTableDevice*:CommNccl*:CudaBlas*:CudaBundle*:CudaCache*:CudaDevice*:CudaModel*:*KcuAttentionTc*:LlamaFsdpCuda*:LlamaInitCuda*:StageDevice*:StateDev*:CudaExact*:*CudaKernels*:HfArchCuda*:TrainAccumGpu*:TrainEvalGpu*:SchedulesGpu*
# What `make test` runs of them: the tests that take seconds under emulation (the fiber emulation of
# tests/kcu_emu.h; measured 2026-12-01 on 2 cores: the whole set about 2 minutes, of which the Hugging Face
# grid's configs with the pad token in their batch in float32 and the eval stage on the GPU take 25 s).
# Left out: the rest of the grid (HfGridGpu*: every config in float32 and in bf16, expert parallelism on 2
# GPUs, 3 GPUs with accumulation, HSDP on 4: about 5 minutes), the attention sweeps and throughput print,
# the FSDP tests of 45-95 s (activation checkpointing, chunked head, offloaded optimizer over several steps;
# HfArchCuda's bf16, checkpointing and 2-rank runs), and the bagel recipe on the emulated GPU.
EMU_QUICK := EmuCudart*:FreezeGpu*:PluginHooksGpu*:HfGridGpu.PadConfigsAndEvalOnOneGpu:PadTokenGpu*:CudaMoe*:MoeCuda.FourSteps*:HsdpGpu*:PluginApiGpu*:*CudaKernels*:ModelTableDevice*:CommNccl*:CudaBlas*:CudaCache*:CudaDevice*:CudaModel*:StateDev*:StageDevice*:LlamaFsdpCuda*:LlamaInitCuda*:KcuAttentionTc.*:HfArchCudaKernels*:HfArchCuda.F32FiveStepsMatchTheCpuPath:E2EWorkflow.Offload*-StageDevice.GpuBagelBootstrapEqualsCpu:LlamaFsdpCuda.ActivationCheckpointingAndKeptLayersMatchTheDefault:LlamaFsdpCuda.ChunkedHeadMatchesTheWholeBatchHead:LlamaFsdpCuda.OffloadedOptimizerEqualsDeviceOptimizer
emu:
	$(MAKE) EMU=1 all $(addprefix build-emu/,tests/fsdp_tests $(TEST_PLUGIN_SRCS:tests/plugins/%.c=tests/plugins/lib%.so) \
	  $(TEST_MPI_SRCS:tests/mpi/%.c=tests/mpi/%))
test-emu:
	$(MAKE) EMU=1 test-emu-run
test-emu-run: $(BIN) $(PLUGINS) $(TEST_PLUGINS) $(TEST_MPI_BINS) $(TEST_BIN)
	FSDP_EMU_DEVICES=2 FSDP_RUN_BIN=$(BIN) FSDP_PLUGIN_DIR=$(BUILD)/plugins OMP_NUM_THREADS=2 $(TEST_BIN) \
	  --gtest_filter='$(EMU_SUITES)' $(GTEST_ARGS)

asan:
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 \
	$(MAKE) BUILD=build-asan CUDA=0 OPT=-O1 \
	  SAN_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" test

fuzz:
	FSDP_SETUP_FUZZ=1 sh tools/setup.sh
	$(MAKE) -f tests/fuzz/fuzz.mk BUILD=build-fuzz

# FSDP_BUNDLE_LINK: the link command bundle.sh relinks with when patchelf is missing.
bundle: $(BIN)
	FSDP_BUNDLE_LINK='$(CC) $(LDFLAGS) $(BUILD)/obj/cli/main.o $(WHOLE_LIB) $(LDLIBS)' \
	  sh tools/bundle.sh $(BIN) $(BUILD)/bundle

# What a lent GPU machine runs (tools/gpu_session.sh): binaries, tests, benchmarks, fixtures.
gpu-kit: $(BIN) $(PLUGINS) $(TEST_PLUGINS) $(TEST_MPI_BINS) $(TEST_BIN) $(BENCHES)
	sh tools/gpu_kit.sh $(BUILD)

setup:
	sh tools/setup.sh
	$(MAKE) all

clean:
	rm -rf $(BUILD) build-asan build-fuzz build-emu

-include $(if $(EMU_SOS),$(BUILD)/lib/emu_cublaslt.d $(BUILD)/lib/emu_cublas.d) $(LIB_OBJS:.o=.d) $(TEST_OBJS:.o=.d) $(BUILD)/obj/cli/main.d
