# histd: `make run` and `make test` are the two commands of README's quick
# start. Both install the Debian packages first (deploy/install-deps.sh).

BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
LISTEN     ?= 127.0.0.1:50051

.PHONY: all deps build run test test-fast test-asan test-tsan bench clean

all: build

deps:
	./deploy/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

run: build
	./$(BUILD)/server/histd --listen $(LISTEN) --driver file --data-dir ./data --auth-disabled

# Every test on the normal build, then every test again built with
# AddressSanitizer and UBSan.
test: build test-fast test-asan

test-fast: build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DHISTD_SANITIZE=ON >/dev/null
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -j$(JOBS) -LE nosan

# Every test (but the nosan ones and valgrind's) built with
# ThreadSanitizer; not part of `make test`. gRPC, libpq, libcurl and
# libmicrohttpd are not instrumented: the interceptors they call are
# ignored, and tests/tsan.supp says what else is suppressed and why.
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DHISTD_TSAN=ON >/dev/null
	cmake --build $(TSAN_BUILD) -j$(JOBS)
	TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 history_size=4 \
	ignore_noninstrumented_modules=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	ctest --test-dir $(TSAN_BUILD) --output-on-failure -j$(JOBS) -LE nosan

bench: build
	./$(BUILD)/tests/bench/histd-bench --histd ./$(BUILD)/server/histd
	./$(BUILD)/tests/bench/histd-file-bench --histd ./$(BUILD)/server/histd

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
