# agenthost: thin wrappers around meson + ninja.
#
#   make run     install missing packages, build, start `agenthost serve`
#   make test    every test, an ASan/UBSan run of the unit tests, format check, minimal build
#   make bench   build, run the benchmarks
#   make fuzz    build the libFuzzer harnesses (clang) and run each for FUZZ_SECONDS
#   make soak    one daemon under load on every surface for SOAK_SECONDS (default 1800): RSS, fds, crashes
#   make deb     the Debian packages (debian/) in a clean copy, into build-deb/, checked by lintian
#
# The build itself is described by meson.build; nothing here knows about individual sources.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

MESON ?= meson
NINJA ?= ninja
PYTHON ?= python3
CLANG_FORMAT ?= clang-format

# Extra arguments for `make run`, e.g. make run ARGS='--config my.ini'.
ARGS ?=

BUILD_DIR := build
ASAN_DIR := build-asan
MINIMAL_DIR := build-minimal
FUZZ_DIR := build-fuzz
DEB_DIR := build-deb
CLANG ?= clang

ASAN_OPTS := -Db_sanitize=address,undefined -Db_lundef=false
MINIMAL_OPTS := -Dauto_features=disabled
# The fuzzing build: clang, libFuzzer's coverage on every object, ASan + UBSan; no Criterion tests.
FUZZ_OPTS := -Dfuzz=true -Dtests=disabled -Db_sanitize=address,undefined -Db_lundef=false
# How long each harness runs: `make fuzz` (FUZZ_SECONDS=300 make fuzz for longer) and within `make test`.
FUZZ_SECONDS ?= 60
TEST_FUZZ_SECONDS ?= 30
# How long `make soak` runs (bench/soak.py; the test suite runs a 45 s version).
SOAK_SECONDS ?= 1800
# Sanitized code runs several times slower; stretch the per-test timeouts meson.build sets.
ASAN_TIMEOUT_MULTIPLIER ?= 3

# Environment of the sanitized test run. AH_KEEP_PLUGINS_MAPPED keeps unloaded plugins mapped so that
# leak reports can still name their frames.
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 AH_KEEP_PLUGINS_MAPPED=1

TESTLOGS := $(BUILD_DIR)/meson-logs/testlog.json $(ASAN_DIR)/meson-logs/testlog.json \
  $(FUZZ_DIR)/meson-logs/testlog.json

# The C sources under version control (what format / format-check look at).
LIST_SOURCES := git ls-files -z -- '*.c' '*.h'

# $(call meson-setup,DIR,OPTIONS): set up DIR with OPTIONS unless it already is. The options of the
# last setup are recorded in DIR/.ah-setup-options; if they differ (OPTIONS changed in this Makefile or
# on the command line), DIR is removed and set up afresh so that no option lingers. A configured
# directory is otherwise left alone: ninja re-runs meson by itself when a meson.build changes.
# Written as one command whose status is the setup's, so it can be chained with && inside `|| rc=1`
# (where the shell's -e does not apply).
define meson-setup
{ if [ -f '$(1)/meson-private/coredata.dat' ] && \
     [ "$$(cat '$(1)/.ah-setup-options' 2>/dev/null || true)" != '$(strip $(2))' ]; then \
    echo 'meson-setup: $(1) was set up with other options; setting it up again'; \
    rm -rf '$(1)'; \
  fi; \
  if [ ! -f '$(1)/meson-private/coredata.dat' ]; then \
    $(MESON) setup '$(1)' $(2) && \
    printf '%s\n' '$(strip $(2))' >'$(1)/.ah-setup-options'; \
  fi; }
endef

# Step bodies shared by their own targets and by `test` (which runs them without a sub-make, so that
# `make -n test` stays a dry run). Each is a single &&-chain.
UNIT_ASAN = $(call meson-setup,$(ASAN_DIR),$(ASAN_OPTS)) && \
  $(NINJA) -C $(ASAN_DIR) && \
  env $(ASAN_ENV) $(MESON) test -C $(ASAN_DIR) --suite unit --suite system --suite postgresql --print-errorlogs \
    --timeout-multiplier $(ASAN_TIMEOUT_MULTIPLIER)
# $(call fuzz-run,SECONDS): set up and build $(FUZZ_DIR) with clang, run every harness (suite fuzz).
fuzz-run = ( export CC=$(CLANG) && $(call meson-setup,$(FUZZ_DIR),$(FUZZ_OPTS)) ) && \
  $(NINJA) -C $(FUZZ_DIR) && \
  env AH_FUZZ_SECONDS=$(1) $(MESON) test -C $(FUZZ_DIR) --suite fuzz --verbose --num-processes 2
FORMAT_CHECK = $(LIST_SOURCES) | xargs -0 -r $(CLANG_FORMAT) --dry-run -Werror

.PHONY: all deps build run test unit-asan minimal bench soak fuzz fuzz-merge deb format format-check clean

all: build

deps:
	@bash scripts/deps.sh

build: deps
	@$(call meson-setup,$(BUILD_DIR),)
	$(NINJA) -C $(BUILD_DIR)

run: build
	exec ./$(BUILD_DIR)/host/agenthost serve $(ARGS)

# Every step runs even when an earlier one failed, so one run reports everything; the exit status is
# non-zero if any step failed, and the last line printed is the summary of both test runs.
test: deps build minimal
	@rm -f $(TESTLOGS)
	@rc=0; \
	echo '== meson test ($(BUILD_DIR))'; \
	$(MESON) test -C $(BUILD_DIR) --print-errorlogs || rc=1; \
	echo '== meson test --suite unit --suite system --suite postgresql ($(ASAN_DIR): ASan + UBSan)'; \
	{ $(UNIT_ASAN); } || rc=1; \
	echo '== fuzz ($(FUZZ_DIR): libFuzzer, each harness $(TEST_FUZZ_SECONDS) s)'; \
	{ $(call fuzz-run,$(TEST_FUZZ_SECONDS)); } || rc=1; \
	echo '== format-check'; \
	{ $(FORMAT_CHECK); } || { rc=1; echo 'format-check failed: run `make format`'; }; \
	echo '== summary'; \
	$(PYTHON) scripts/test-summary.py $(TESTLOGS) || rc=1; \
	exit $$rc

# The unit tests again, built with AddressSanitizer + UndefinedBehaviorSanitizer (part of `make test`).
unit-asan: deps
	$(UNIT_ASAN)

# The host alone, every optional feature (plugins, tests) disabled: it must compile, and `serve` must
# run with no plugins and stop cleanly.
minimal: deps
	@$(call meson-setup,$(MINIMAL_DIR),$(MINIMAL_OPTS))
	$(NINJA) -C $(MINIMAL_DIR)
	./$(MINIMAL_DIR)/host/agenthost version
	bash scripts/smoke-serve.sh ./$(MINIMAL_DIR)/host/agenthost

bench: build
	$(MESON) test -C $(BUILD_DIR) --benchmark --verbose

# The soak: bench/soak.py against the build tree's daemon for SOAK_SECONDS, figures and verdicts at the end.
soak: build
	$(PYTHON) bench/soak.py --agenthost $(BUILD_DIR)/host/agenthost --fake-model tests/fakes/fake_model.py \
	  --python-client plugins/sdk/python --seconds $(SOAK_SECONDS)

# The libFuzzer harnesses of tests/fuzz, each for FUZZ_SECONDS from its seed corpus; what they find stays
# in $(FUZZ_DIR)/tests/fuzz/work/ (crashes included) until `make fuzz-merge`.
fuzz: deps
	@$(call fuzz-run,$(FUZZ_SECONDS))

# Add to tests/fuzz/corpus/ the inputs of the last `make fuzz` that bring new coverage (libFuzzer's
# -merge=1 keeps a minimal set); commit them with the change that made them reachable.
fuzz-merge:
	@for w in $(FUZZ_DIR)/tests/fuzz/work/*/; do \
	  name=$$(basename "$$w"); \
	  ./$(FUZZ_DIR)/tests/fuzz/fuzz_$$name -merge=1 tests/fuzz/corpus/$$name "$$w/corpus" 2>&1 | tail -1; \
	done

# The Debian packages: a clean copy of the tree (what git tracks or does not ignore) in
# $(DEB_DIR)/agenthost-VERSION, dpkg-buildpackage -b -us -uc, then lintian; the .deb files land in $(DEB_DIR).
deb: deps
	bash scripts/deb.sh $(DEB_DIR)

format:
	$(LIST_SOURCES) | xargs -0 -r $(CLANG_FORMAT) -i

format-check:
	$(FORMAT_CHECK)

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) $(MINIMAL_DIR) $(FUZZ_DIR) $(DEB_DIR)
