# attn: C core + Lua 5.4 binding. `make test` and `make demo` work on a fresh
# Debian 12 machine: they install missing packages first (needs root).

LUA        ?= lua5.4
BUSTED     ?= $(LUA) /usr/bin/busted
PKG_CONFIG ?= pkg-config
PREFIX     ?= /usr/local
DESTDIR    ?=
LUA_VERSION       = 5.4
# LuaRocks' variables: LUA_INCDIR is a directory (lua.h), LUADIR and LIBDIR
# the install folders of Lua and C modules; CFLAGS and LIBFLAG below. The
# module never links liblua (the interpreter provides it), so LUA_LIBDIR is
# accepted and unused.
LUA_INCDIR        ?= $(patsubst -I%,%,$(filter -I%,$(shell $(PKG_CONFIG) --cflags lua5.4 2>/dev/null)))
LUA_CFLAGS         = $(if $(LUA_INCDIR),-I$(LUA_INCDIR))
LUA_LMOD_DIR      ?= $(if $(LUADIR),$(LUADIR),$(PREFIX)/share/lua/$(LUA_VERSION))
LUA_CMODULE_DIR   ?= $(if $(LIBDIR),$(LIBDIR),$(PREFIX)/lib/lua/$(LUA_VERSION))
BLAS_FLAGS        ?= $(shell $(PKG_CONFIG) --cflags openblas lapacke 2>/dev/null)
BLAS_LIBS         ?= $(shell $(PKG_CONFIG) --libs openblas lapacke 2>/dev/null)
CAIRO_FLAGS       ?= $(shell $(PKG_CONFIG) --cflags cairo 2>/dev/null)
CAIRO_LIBS        ?= $(shell $(PKG_CONFIG) --libs cairo 2>/dev/null)
# Open MPI, only for attn.mpi (lua/attn/mpi.so); pkg-config's name is "ompi".
MPI_FLAGS         ?= $(shell $(PKG_CONFIG) --cflags ompi 2>/dev/null)
MPI_LIBS          ?= $(shell $(PKG_CONFIG) --libs ompi 2>/dev/null)

CC       ?= gcc
# The baseline build runs on any CPU of its architecture: the vectorised row
# math in src/cpu/ is compiled once per instruction set with its own flags and
# chosen at run time (src/cpu/cpu_dispatch.c), so no -march=native is needed.
# -fvect-cost-model=dynamic: GCC's -O2 model only vectorises loops that need
# no runtime checks, which leaves the elementwise kernels scalar.
OPT      ?= -O2 -fvect-cost-model=dynamic
CFLAGS   ?= $(OPT)
# Warnings are errors in CI (.ci/run sets WERROR) and for the default build;
# a user who passes their own OPT or CFLAGS (another compiler, other warnings)
# gets the warnings without the failure unless they ask for WERROR=-Werror.
ifeq ($(origin OPT)$(origin CFLAGS),filefile)
WERROR   ?= -Werror
endif
WARN      = -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra $(WERROR) -Wno-unused-parameter
# Per-ISA flags of the src/cpu/ translation units (x86-64 only; elsewhere the
# generic path alone is built and the others compile to nothing).
ifneq ($(filter x86_64%,$(shell $(CC) -dumpmachine)),)
CPU_FLAGS_avx2   = -mavx2 -mfma -ffp-contract=fast
CPU_FLAGS_avx512 = -mavx512f -mavx512dq -mavx512vl -mavx512bw -mfma -mprefer-vector-width=512 -ffp-contract=fast
endif
# -fno-trapping-math lets float selects (clamps, special values) be if-converted,
# which the vectoriser needs; the kernels never rely on floating-point traps.
CPU_OPT   = -O3 -fno-trapping-math
LIBFLAG  ?= -shared
# Symbols of static archives linked into the module (the aarch64 sysroot's libm.a) stay hidden too,
# so core.so exports luaopen_attn_core alone whatever libraries it pulls in.
MODULE_LDFLAGS = -Wl,--exclude-libs,ALL
# -fvisibility=hidden: core.so exports its luaopen_* (ATTN_EXPORT, src/bind/lbind.h) and nothing
# else. Only the binding (src/bind/) sees Lua's headers: LUA_CFLAGS go to its objects alone.
ALL_CFLAGS = $(WARN) $(CFLAGS) -fPIC -fvisibility=hidden -Isrc $(BLAS_FLAGS)
LDLIBS    = $(BLAS_LIBS) -lpthread -lm

DEBIAN_PACKAGES = lua5.4 liblua5.4-dev libopenblas-dev liblapacke-dev lua-busted lua-check \
                  lua-cjson lua-filesystem pkgconf gcc make cppcheck valgrind \
                  fonts-dejavu-core \
                  libcairo2-dev \
                  lua-expat \
                  lua-ldoc \
                  lua-markdown \
                  luarocks
# Optional data: Fashion-MNIST's idx files (attn.data.fashion_mnist, captioning).
IMAGE_PACKAGES  = dataset-fashion-mnist
# Only the MPI targets (make mpi, test-mpi, bench-mpi) need these: make deps-mpi.
MPI_PACKAGES    = openmpi-bin libopenmpi-dev

# The layers, each in its folder: bind (the Lua binding) -> nn (layer kernels) -> attention
# (attention kernels) -> core (tensors and their ops) -> cpu (the per-ISA kernels).
LAYERS    = core attention nn bind cpu
SRC       = $(foreach d,$(LAYERS),$(wildcard src/$(d)/*.c))
HEADERS   = $(wildcard src/*.h) $(foreach d,$(LAYERS),$(wildcard src/$(d)/*.h))
# OBJ_DIR and MODULE are variables so a cross build (check-aarch64) keeps its own.
OBJ_DIR  ?= build/obj
OBJ       = $(SRC:src/%.c=$(OBJ_DIR)/%.o)
ASAN_OBJ  = $(SRC:src/%.c=build/asan/%.o)
MODULE   ?= lua/attn/core.so
ASAN_MODULE = build/asan/attn/core.so
# attn.cairo (drawing for attn.plot) is a separate module so attn.core links no cairo.
CAIRO_SRC   = src/plot/lcairo.c
CAIRO_MODULE ?= lua/attn/cairo.so
ASAN_CAIRO_MODULE = build/asan/attn/cairo.so
# attn.mpi (MPI collectives for attn.distributed) likewise: built by `make mpi`, not by `all`.
MPI_SRC     = src/mpi/lmpi.c
MPI_MODULE ?= lua/attn/mpi.so
# mpirun for the MPI specs and bench on one machine: more ranks than cores, and root allowed
# (CI runs as root); shared-memory single copy off, which containers often forbid.
MPIRUN ?= env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none \
          mpirun --oversubscribe

LUA_ENV = LUA_PATH="lua/?.lua;lua/?/init.lua;spec/?.lua;;" LUA_CPATH="lua/?.so;;" OPENBLAS_NUM_THREADS=1

.PHONY: all deps deps-images deps-mpi mpi test-mpi bench-mpi test test-exit test-asan test-leaks fuzz fuzz-files check-c \
        check-c-run check-vmath-ulp check-install doc \
        doc-check demo bench lint clean install uninstall examples help check-aarch64

all: $(MODULE) $(CAIRO_MODULE) ## build lua/attn/core.so and lua/attn/cairo.so

# `make help`: every target with its one-line description (its "##" comment).
help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z0-9-]+):.*## /\1\t/' | awk -F '\t' '{ printf "  %-15s %s\n", $$1, $$2 }'

# Installs whatever Debian package is missing (first command on a fresh machine).
# NO_DEPS=1 skips it (packagers, LuaRocks, machines without apt). The image
# dataset is optional: the core builds and tests without it (its specs skip),
# so a failure to install it is reported and not fatal.
apt_missing = if [ "$(NO_DEPS)" = 1 ]; then exit 0; fi; \
	missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing missing Debian packages with apt-get:$$missing (NO_DEPS=1 skips this)"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
deps: ## install the missing Debian packages with apt-get (skipped with NO_DEPS=1)
	@$(call apt_missing,$(DEBIAN_PACKAGES))
	@($(call apt_missing,$(IMAGE_PACKAGES))) || echo "make deps: optional $(IMAGE_PACKAGES) not installed (its specs skip)"

deps-images: ## install the optional image dataset (Fashion-MNIST, for attn.data and the captioning example)
	@$(call apt_missing,$(IMAGE_PACKAGES))

# Open MPI for attn.distributed; the rest of attn needs none of it.
deps-mpi: deps ## install Open MPI (openmpi-bin, libopenmpi-dev) for attn.distributed
	@$(call apt_missing,$(MPI_PACKAGES))

mpi: deps-mpi ## build lua/attn/mpi.so (attn.distributed's MPI binding; installs Open MPI first)
	@$(MAKE) --no-print-directory all $(MPI_MODULE)

$(OBJ_DIR)/%.o: src/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "cc $<"; $(CC) $(ALL_CFLAGS) -c $< -o $@

# The optimizer loops vectorise only without errno around sqrt (src/nn/attn_optim.c).
$(OBJ_DIR)/nn/attn_optim.o: ALL_CFLAGS += -fno-math-errno

$(OBJ_DIR)/bind/%.o: ALL_CFLAGS += $(LUA_CFLAGS)

# src/cpu/<name>_<isa>.c: compiled with CPU_FLAGS_<isa> (the last word of the file name).
cpu_isa_flags = $(CPU_FLAGS_$(lastword $(subst _, ,$1)))

$(OBJ_DIR)/cpu/%.o: src/cpu/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "cc $< $(call cpu_isa_flags,$*)"; $(CC) $(ALL_CFLAGS) $(CPU_OPT) $(call cpu_isa_flags,$*) -c $< -o $@

$(MODULE): $(OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LIBFLAG) $(MODULE_LDFLAGS) -o $@ $(OBJ) $(LDLIBS)

$(CAIRO_MODULE): $(CAIRO_SRC)
	@mkdir -p $(dir $@)
	@echo "cc $<"; $(CC) $(WARN) $(CFLAGS) -fPIC $(LUA_CFLAGS) $(CAIRO_FLAGS) $(LIBFLAG) $< -o $@ $(CAIRO_LIBS)

$(MPI_MODULE): $(MPI_SRC) src/core/attn_tensor.h src/core/attn_error.h
	@mkdir -p $(dir $@)
	@echo "cc $<"; $(CC) $(WARN) $(CFLAGS) -fPIC -Isrc $(LUA_CFLAGS) $(MPI_FLAGS) $(LIBFLAG) $< -o $@ $(MPI_LIBS) -ldl

ASAN_CFLAGS = $(WARN) -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all \
	  -fPIC -fvisibility=hidden -Isrc $(BLAS_FLAGS)
build/asan/%.o: src/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "cc (asan) $<"; $(CC) $(ASAN_CFLAGS) -DATTN_SANITIZED_BUILD -c $< -o $@

build/asan/bind/%.o: ASAN_CFLAGS += $(LUA_CFLAGS)

build/asan/cpu/%.o: src/cpu/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "cc (asan) $<"; $(CC) $(ASAN_CFLAGS) $(call cpu_isa_flags,$*) -c $< -o $@

$(ASAN_MODULE): $(ASAN_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LIBFLAG) $(MODULE_LDFLAGS) -fsanitize=address,undefined -o $@ $(ASAN_OBJ) $(LDLIBS)

$(ASAN_CAIRO_MODULE): $(CAIRO_SRC)
	@mkdir -p $(dir $@)
	@echo "cc (asan) $<"; $(CC) $(WARN) -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all \
	  -fPIC $(LUA_CFLAGS) $(CAIRO_FLAGS) $(LIBFLAG) $< -o $@ $(CAIRO_LIBS)

# Specs through busted's TAP output; tools/tap-summary prints "N passed, N failed".
test: deps ## build and run every spec ("N passed, N failed")
	@$(MAKE) --no-print-directory all
	@$(LUA_ENV) $(BUSTED) -o TAP $(BUSTED_ARGS) spec | tools/tap-summary

# attn.distributed under mpirun with 1, 2 and 4 processes (spec/mpi/, run by one busted that
# starts the mpirun jobs; not part of `make test`, which needs no MPI).
test-mpi: deps-mpi ## attn.distributed's specs under mpirun -np 1, 2, 4 ("N passed, N failed")
	@$(MAKE) --no-print-directory all $(MPI_MODULE)
	@$(LUA_ENV) ATTN_MPIRUN="$(MPIRUN)" $(BUSTED) -o TAP --pattern=_mpi $(BUSTED_ARGS) spec/mpi | tools/tap-summary

bench-mpi: deps-mpi ## allreduce MB/s and the Transformer step, 1 process x 2 threads vs 2 x 1 (bench/mpi_bench.lua)
	@$(MAKE) --no-print-directory all $(MPI_MODULE)
	@$(LUA_ENV) MPIRUN="$(MPIRUN)" $(LUA) bench/mpi_bench.lua

# The whole suite with the module under AddressSanitizer + UBSan; any report fails.
# busted puts its --cpath (.busted: lua/?.so) ahead of LUA_CPATH, so the sanitized
# module's folder is given as --cpath; spec/core/sanitizer_spec.lua checks which
# module was loaded (ATTN_SANITIZED=1 asks it to insist on the sanitized one).
ASAN_ENV = LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  LUA_PATH="lua/?.lua;lua/?/init.lua;spec/?.lua;;" LUA_CPATH="build/asan/?.so;;" OPENBLAS_NUM_THREADS=1 \
	  ATTN_SANITIZED=1
test-asan: deps ## every spec with the module under AddressSanitizer and UBSan
	@$(MAKE) --no-print-directory $(ASAN_MODULE) $(ASAN_CAIRO_MODULE)
	@$(ASAN_ENV) $(BUSTED) --cpath="build/asan/?.so" -o TAP $(BUSTED_ARGS) spec | tools/tap-summary

# libFuzzer (clang) on the file readers: tools/fuzz_files.c with the C core
# linked in, coverage-instrumented, under ASan+UBSan, for FUZZ_FILES_SECONDS.
FUZZ_CC            ?= clang
FUZZ_FILES_SECONDS ?= 60
FUZZ_FLAGS = -std=c11 -D_POSIX_C_SOURCE=200809L -Isrc -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined
FUZZ_OBJ   = $(SRC:src/%.c=build/fuzz/%.o)
build/fuzz/%.o: src/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "cc (libfuzzer) $<"; $(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link $(call cpu_isa_flags,$*) \
	  $(if $(filter bind/%,$*),$(LUA_CFLAGS)) $(BLAS_FLAGS) -c $< -o $@

build/fuzz/fuzz_files: tools/fuzz_files.c $(FUZZ_OBJ)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer $(LUA_CFLAGS) tools/fuzz_files.c $(FUZZ_OBJ) -o $@ \
	  $(shell $(PKG_CONFIG) --libs lua5.4 2>/dev/null || echo -llua5.4) $(LDLIBS)

fuzz-files: deps ## libFuzzer on the safetensors, .npy and corpus readers (FUZZ_FILES_SECONDS)
	@$(MAKE) --no-print-directory build/fuzz/fuzz_files
	@d=$$(mktemp -d); $(LUA_ENV) $(LUA) tools/fuzz_seeds.lua $$d && \
	  $(LUA_ENV) ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 build/fuzz/fuzz_files \
	  -max_total_time=$(FUZZ_FILES_SECONDS) -rss_limit_mb=4096 -print_final_stats=1 $$d; rc=$$?; rm -rf $$d; exit $$rc

# The whole suite under LeakSanitizer (the ASan module, leak checking on): a
# leak that nothing references any more fails the run.
test-leaks: deps ## every spec under LeakSanitizer
	@$(MAKE) --no-print-directory $(ASAN_MODULE)
	@$(ASAN_ENV) ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 $(BUSTED) --cpath="build/asan/?.so" -o TAP $(BUSTED_ARGS) spec \
	  | tools/tap-summary

# The seeded API fuzzer (tools/fuzz.lua) against the ASan+UBSan module, in a
# scratch folder (it saves files under hostile names). FUZZ_SECONDS, FUZZ_SEED.
FUZZ_SECONDS ?= 60
FUZZ_SEED    ?= $(shell date +%s)
fuzz: deps ## the seeded API fuzzer under ASan+UBSan (FUZZ_SECONDS, FUZZ_SEED)
	@$(MAKE) --no-print-directory $(ASAN_MODULE)
	@d=$$(mktemp -d); cd $$d && LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  LUA_PATH="$(CURDIR)/lua/?.lua;$(CURDIR)/lua/?/init.lua;;" LUA_CPATH="$(CURDIR)/build/asan/?.so;;" \
	  OPENBLAS_NUM_THREADS=1 $(LUA) $(CURDIR)/tools/fuzz.lua $(FUZZ_SECONDS) $(FUZZ_SEED); rc=$$?; cd /; rm -rf $$d; exit $$rc

# 300 short processes that exit right after starting 64 workers and running a
# job: none may crash (the workers are joined before the library is unloaded).
test-exit: deps ## 300 processes that exit right after a parallel job with 64 workers
	@$(MAKE) --no-print-directory all
	@$(LUA_ENV) ATTN_EXIT_RUNS=300 $(BUSTED) -o TAP spec/core/exit_spec.lua | tools/tap-summary

# The generic C path on another architecture: cross-compile both modules for
# aarch64 against an arm64 Debian root (tools/aarch64-sysroot, made once under
# build/aarch64 without touching the host's packages) and run every spec under
# qemu-user with that root's lua5.4. Child processes the specs start use the same
# interpreter (ATTN_LUA, see spec/helper.lua); no spec bounds a time, so none
# needs scaling (the bench holds those). QUICK=1 leaves out the three stress specs that take 7 of
# the run's 9 minutes under emulation (20,000 1 MiB fills, 700 training steps,
# 16,000 matmuls against finalizers) and test no architecture-specific code.
AARCH64_SLOW = memory_spec train_spec reentrancy_spec
AARCH64_DIR  = build/aarch64
AARCH64_ROOT = $(CURDIR)/$(AARCH64_DIR)/sysroot
AARCH64_LUA  = qemu-aarch64 -L $(AARCH64_ROOT) $(AARCH64_ROOT)/usr/bin/lua5.4
check-aarch64: ## cross-build for aarch64, run the specs under qemu-user (QUICK=1: no stress specs)
	@tools/aarch64-sysroot $(AARCH64_DIR)
	@PKG_CONFIG_SYSROOT_DIR=$(AARCH64_ROOT) PKG_CONFIG_LIBDIR=$(AARCH64_ROOT)/usr/lib/aarch64-linux-gnu/pkgconfig:$(AARCH64_ROOT)/usr/share/pkgconfig \
	  $(MAKE) --no-print-directory CC="aarch64-linux-gnu-gcc --sysroot=$(AARCH64_ROOT)" OBJ_DIR=$(AARCH64_DIR)/obj \
	  MODULE=$(AARCH64_DIR)/lua/attn/core.so CAIRO_MODULE=$(AARCH64_DIR)/lua/attn/cairo.so all
	@$(LUA_ENV) ATTN_LUA="$(AARCH64_LUA)" ATTN_SPEC_MODULE=$(AARCH64_DIR)/lua/attn/core.so \
	  $(AARCH64_LUA) $(AARCH64_ROOT)/usr/bin/busted --ignore-lua --cpath="$(AARCH64_DIR)/lua/?.so" \
	  $(if $(QUICK),$(AARCH64_SLOW:%=--exclude-pattern=^%)) -o TAP $(BUSTED_ARGS) spec | tools/tap-summary

# The C core's own unit tests (no Lua), under ASan+UBSan and then valgrind memcheck.
# (A second make evaluates the pkg-config flags after deps has installed pkgconf.)
CORE_SRC = $(filter-out src/bind/% src/cpu/%,$(SRC))
CPU_SRC  = $(wildcard src/cpu/*.c)
check-c: deps ## the C core's unit tests under ASan and valgrind
	@$(MAKE) --no-print-directory check-c-run

check-c-run: $(CPU_SRC:src/%.c=build/asan/%.o) $(CPU_SRC:src/%.c=$(OBJ_DIR)/%.o)
	@mkdir -p build
	$(CC) $(WARN) -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -Isrc $(BLAS_FLAGS) \
	  spec/c/test_core.c $(CORE_SRC) $(CPU_SRC:src/%.c=build/asan/%.o) -o build/test_core_asan $(LDLIBS)
	ASAN_OPTIONS=detect_leaks=1 OPENBLAS_NUM_THREADS=1 build/test_core_asan
	$(CC) $(WARN) -O1 -g -Isrc $(BLAS_FLAGS) spec/c/test_core.c $(CORE_SRC) $(CPU_SRC:src/%.c=$(OBJ_DIR)/%.o) \
	  -o build/test_core $(LDLIBS)
	OPENBLAS_NUM_THREADS=1 valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite \
	  build/test_core

# The float32 exp, tanh, sigmoid and log against libm over all 2^32 inputs on every path this CPU
# has (a few minutes, so not part of `make test`; spec/core/vmath_spec.lua samples the range).
check-vmath-ulp: $(CORE_SRC:src/%.c=$(OBJ_DIR)/%.o) $(CPU_SRC:src/%.c=$(OBJ_DIR)/%.o)
	@mkdir -p build
	$(CC) $(WARN) -O2 -Isrc spec/c/vmath_ulp.c $^ -o build/vmath_ulp $(LDLIBS)
	OPENBLAS_NUM_THREADS=1 build/vmath_ulp

# The LDoc reference (config.ld: lua/attn and the doc-only files in doc-src/
# for the functions written in C) as HTML in doc/, after doc-check: every
# public name, found by walking the attn tables at run time, needs an entry.
doc: doc-check ## build the HTML reference into doc/ (LDoc), after doc-check
	@ldoc -q . && echo "reference: doc/index.html"

doc-check: deps ## list public names without a doc entry; fails if any
	@$(MAKE) --no-print-directory all
	@mkdir -p build
	@LUA_PATH="./?.lua;;" ldoc --filter tools.doc_names.filter . 2>build/ldoc-warnings.txt | grep "	" >build/doc-names.txt
	@$(LUA_ENV) $(LUA) tools/doc-check.lua build/doc-names.txt

# luarocks make into a temporary tree from a clean copy, require attn from
# another folder, luarocks remove; then make install/uninstall with DESTDIR.
check-install: deps ## check the rockspec and make install/uninstall in temporary trees
	@tools/check-install

demo: deps ## train Bahdanau attention on the shipped sample (examples/bahdanau.lua)
	@$(MAKE) --no-print-directory all
	@$(LUA_ENV) $(LUA) examples/bahdanau.lua $(DEMO_ARGS)

# Every example with small sizes (a smoke run, as CI does).
examples: deps ## run every example with small sizes
	@$(MAKE) --no-print-directory all
	@set -e; for f in examples/*.lua; do echo "example $$f"; $(LUA_ENV) ATTN_SMOKE=1 $(LUA) $$f; done

bench: deps ## run bench/bench.lua (QUICK=1: about a minute; ROWS=book: only the book-sized rows; ROWS=<pattern>: the book-sized rows whose id matches; ROWS=conv: conv and pool rows)
	@$(MAKE) --no-print-directory all
	@QUICK=$(QUICK) ROWS=$(ROWS) $(LUA_ENV) $(LUA) bench/bench.lua

lint: deps ## luacheck and cppcheck
	luacheck lua spec examples bench tools
	@# Kernels walk operands through byte pointers with byte strides and cast them to the
	@# element type; the allocator guarantees alignment, so invalidPointerCast is noise here.
	cppcheck --quiet --error-exitcode=1 --enable=warning,performance,portability --inline-suppr \
	  --suppress=missingIncludeSystem --suppress=invalidPointerCast -I src src

install: all ## install into PREFIX (or LUADIR/LIBDIR), honouring DESTDIR
	install -d $(DESTDIR)$(LUA_CMODULE_DIR)/attn $(DESTDIR)$(LUA_LMOD_DIR)/attn
	install -m 755 $(MODULE) $(DESTDIR)$(LUA_CMODULE_DIR)/attn/core.so
	install -m 755 $(CAIRO_MODULE) $(DESTDIR)$(LUA_CMODULE_DIR)/attn/cairo.so
	[ ! -f $(MPI_MODULE) ] || install -m 755 $(MPI_MODULE) $(DESTDIR)$(LUA_CMODULE_DIR)/attn/mpi.so
	cd lua && find attn -name '*.lua' -exec install -D -m 644 {} $(DESTDIR)$(LUA_LMOD_DIR)/{} \;
	install -D -m 644 data/fra-eng-sample.txt $(DESTDIR)$(LUA_LMOD_DIR)/attn/data/fra-eng-sample.txt

# Removes what install put there (the same variables), then the folders left empty.
uninstall: ## remove what make install installed (same PREFIX/LUADIR/LIBDIR/DESTDIR)
	rm -f $(DESTDIR)$(LUA_CMODULE_DIR)/attn/core.so $(DESTDIR)$(LUA_CMODULE_DIR)/attn/cairo.so \
	  $(DESTDIR)$(LUA_CMODULE_DIR)/attn/mpi.so
	cd lua && find attn -name '*.lua' -exec rm -f $(DESTDIR)$(LUA_LMOD_DIR)/{} \;
	rm -f $(DESTDIR)$(LUA_LMOD_DIR)/attn/data/fra-eng-sample.txt
	for d in $(DESTDIR)$(LUA_LMOD_DIR)/attn $(DESTDIR)$(LUA_CMODULE_DIR)/attn; do \
	  [ ! -d $$d ] || find $$d -depth -type d -empty -delete; \
	done

clean: ## remove build outputs
	rm -rf build $(MODULE) $(CAIRO_MODULE) $(MPI_MODULE) out
