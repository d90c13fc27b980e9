# agoc-runner builds. Included from the top Makefile; also works alone:
#   make -f android_runner/runner.mk runner TARGET=host|linux-arm64|android-arm64|android-arm64-ndk
#
#   make runner TARGET=host           build/runner/host/agoc-runner (x86-64 wheel's runtime, from the venv)
#   make runner TARGET=linux-arm64    build/runner/linux-arm64/agoc-runner + its runtime .so files
#   make runner TARGET=android-arm64  the linux-arm64 runner: phones run it through the bundle (no NDK)
#   make runner TARGET=android-arm64-ndk  bionic: needs ANDROID_NDK_HOME and TVM_HOME (android_runner/README.md)
#   make runtime-arm64                the aarch64 runtime from the PyPI wheels -> build/runtime-arm64/
#   make runner-clean                 remove build/runner and build/runtime-*

RUNNER_TARGETS     := host linux-arm64 android-arm64 android-arm64-ndk
RUNNER_TARGET      := $(or $(TARGET),host)
RUNNER_SRC_DIR     := android_runner
RUNNER_OUT         := build/runner
RUNNER_JOBS        ?= 2
RUNNER_PY          ?= $(or $(PY),.venv/bin/python)
RUNNER_SOURCES     := $(wildcard $(RUNNER_SRC_DIR)/src/*.cc $(RUNNER_SRC_DIR)/src/*.h) \
                      $(RUNNER_SRC_DIR)/CMakeLists.txt
RUNTIME_ARM64      := build/runtime-arm64
RUNTIME_ANDROID    := build/runtime-android-arm64
TVM_WHEEL          := apache-tvm==0.27.0.post1
TVM_FFI_WHEEL      := apache-tvm-ffi==0.1.14.post1
ANDROID_NDK_HOME   ?= $(or $(ANDROID_NDK_ROOT),$(ANDROID_NDK))
ANDROID_API        ?= 28
NDK_TOOLCHAIN      := $(ANDROID_NDK_HOME)/build/cmake/android.toolchain.cmake
RUNNER_CMAKE       := cmake -DCMAKE_BUILD_TYPE=Release -S $(RUNNER_SRC_DIR)

.PHONY: runner runner-host runner-linux-arm64 runner-android-arm64 runner-android-arm64-ndk runtime-arm64 runner-clean

ifeq ($(filter $(RUNNER_TARGET),$(RUNNER_TARGETS)),)
runner:
	@echo "agoc: unknown runner TARGET '$(RUNNER_TARGET)'; choose one of: $(RUNNER_TARGETS)" >&2; exit 2
else
runner: runner-$(RUNNER_TARGET)
endif

runner-host: $(RUNNER_OUT)/host/agoc-runner
runner-linux-arm64: $(RUNNER_OUT)/linux-arm64/agoc-runner
runner-android-arm64: runner-linux-arm64
runtime-arm64: $(RUNTIME_ARM64)/.extracted

define runner_need_tool
	@command -v $(1) >/dev/null 2>&1 || { echo "agoc: $(1) not found: $(2)" >&2; exit 1; }
endef

# host: headers and libraries straight from the installed wheels
$(RUNNER_OUT)/host/agoc-runner: $(RUNNER_SOURCES)
	$(call runner_need_tool,cmake,install cmake (apt-get install cmake))
	$(call runner_need_tool,g++,install g++ (apt-get install g++))
	@test -x $(RUNNER_PY) || { echo "agoc: $(RUNNER_PY) not found: run \`make setup\` first (the host runner links the venv's TVM runtime)" >&2; exit 1; }
	@site=$$($(RUNNER_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	$(RUNNER_CMAKE) -B $(RUNNER_OUT)/host/cmake \
	  -DAGOC_TVM_FFI_INCLUDE_DIR=$$site/tvm_ffi/include \
	  -DAGOC_TVM_LIB_DIR=$$site/tvm/lib -DAGOC_TVM_FFI_LIB_DIR=$$site/tvm_ffi/lib \
	  -DAGOC_OUTPUT_DIR=$(abspath $(RUNNER_OUT)/host) >/dev/null && \
	cmake --build $(RUNNER_OUT)/host/cmake -j $(RUNNER_JOBS)

# linux-arm64: the prebuilt aarch64 runtime of the same wheels, cross g++
$(RUNTIME_ARM64)/.extracted: $(RUNNER_SRC_DIR)/tools/extract_runtime.py
	@mkdir -p $(RUNTIME_ARM64)/wheels
	@if ls $(RUNTIME_ARM64)/wheels/apache_tvm-*aarch64*.whl $(RUNTIME_ARM64)/wheels/apache_tvm_ffi-*aarch64*.whl >/dev/null 2>&1; then :; else \
	  test -x $(RUNNER_PY) || { echo "agoc: $(RUNNER_PY) not found: run \`make setup\` first (pip downloads the aarch64 wheels)" >&2; exit 1; }; \
	  echo "downloading the aarch64 $(TVM_WHEEL) and $(TVM_FFI_WHEEL) wheels into $(RUNTIME_ARM64)/wheels"; \
	  $(RUNNER_PY) -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_aarch64 \
	    --python-version 3.11 $(TVM_WHEEL) $(TVM_FFI_WHEEL) -d $(RUNTIME_ARM64)/wheels; fi
	python3 $(RUNNER_SRC_DIR)/tools/extract_runtime.py $(RUNTIME_ARM64)/wheels $(RUNTIME_ARM64)
	@touch $@

$(RUNNER_OUT)/linux-arm64/agoc-runner: $(RUNNER_SOURCES) $(RUNNER_SRC_DIR)/cmake/aarch64-linux-gnu.cmake $(RUNTIME_ARM64)/.extracted
	$(call runner_need_tool,cmake,install cmake (apt-get install cmake))
	$(call runner_need_tool,aarch64-linux-gnu-g++,install g++-aarch64-linux-gnu (or run \`make setup\`))
	@$(RUNNER_CMAKE) -B $(RUNNER_OUT)/linux-arm64/cmake \
	  -DCMAKE_TOOLCHAIN_FILE=$(abspath $(RUNNER_SRC_DIR)/cmake/aarch64-linux-gnu.cmake) \
	  -DAGOC_TVM_FFI_INCLUDE_DIR=$(abspath $(RUNTIME_ARM64)/include) \
	  -DAGOC_TVM_LIB_DIR=$(abspath $(RUNTIME_ARM64)/lib) -DAGOC_COPY_RUNTIME=ON \
	  -DAGOC_OUTPUT_DIR=$(abspath $(RUNNER_OUT)/linux-arm64) >/dev/null && \
	cmake --build $(RUNNER_OUT)/linux-arm64/cmake -j $(RUNNER_JOBS)

# android-arm64-ndk: NDK + a TVM checkout (the runtime must be built for bionic; no wheel exists).
# Untested here (no NDK on these machines); the steps follow android_runner/README.md.
runner-android-arm64-ndk:
	@test -n "$(ANDROID_NDK_HOME)" -a -f "$(NDK_TOOLCHAIN)" || { \
	  echo "agoc: android-arm64-ndk needs the Android NDK: set ANDROID_NDK_HOME to an NDK (r25+) that has build/cmake/android.toolchain.cmake" >&2; \
	  echo "      (got ANDROID_NDK_HOME='$(ANDROID_NDK_HOME)'); see android_runner/README.md" >&2; exit 1; }
	@test -n "$(TVM_HOME)" -a -f "$(TVM_HOME)/CMakeLists.txt" -a -d "$(TVM_HOME)/3rdparty/tvm-ffi/include" || { \
	  echo "agoc: android-arm64-ndk needs a TVM v0.27 source checkout as TVM_HOME (with submodules) to build the bionic runtime:" >&2; \
	  echo "      git clone --recursive --branch v0.27.0 https://github.com/apache/tvm && make runner TARGET=android-arm64-ndk TVM_HOME=\$$PWD/tvm" >&2; \
	  echo "      (got TVM_HOME='$(TVM_HOME)'); see android_runner/README.md" >&2; exit 1; }
	$(call runner_need_tool,cmake,install cmake (apt-get install cmake))
	cmake -S $(TVM_HOME) -B $(RUNTIME_ANDROID) -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_TOOLCHAIN_FILE=$(NDK_TOOLCHAIN) -DANDROID_ABI=arm64-v8a -DANDROID_PLATFORM=android-$(ANDROID_API) \
	  -DANDROID_STL=c++_shared -DUSE_LLVM=OFF -DUSE_RPC=ON -DUSE_CPP_RPC=OFF -DUSE_LIBBACKTRACE=OFF \
	  -DUSE_OPENCL=OFF -DUSE_VULKAN=OFF -DUSE_CUDA=OFF
	cmake --build $(RUNTIME_ANDROID) --target tvm_runtime tvm_runtime_extra -j $(RUNNER_JOBS)
	@mkdir -p $(RUNTIME_ANDROID)/lib && \
	for lib in libtvm_runtime.so libtvm_runtime_extra.so libtvm_ffi.so; do \
	  found=$$(find $(RUNTIME_ANDROID) -name $$lib -type f -not -path '$(RUNTIME_ANDROID)/lib/*' | head -1); \
	  test -n "$$found" || { echo "agoc: the TVM build made no $$lib" >&2; exit 1; }; \
	  cp -f "$$found" $(RUNTIME_ANDROID)/lib/; done
	$(RUNNER_CMAKE) -B $(RUNNER_OUT)/android-arm64-ndk/cmake \
	  -DCMAKE_TOOLCHAIN_FILE=$(NDK_TOOLCHAIN) -DANDROID_ABI=arm64-v8a -DANDROID_PLATFORM=android-$(ANDROID_API) \
	  -DANDROID_STL=c++_shared \
	  -DAGOC_TVM_FFI_INCLUDE_DIR=$(TVM_HOME)/3rdparty/tvm-ffi/include \
	  -DAGOC_DLPACK_INCLUDE_DIR=$(TVM_HOME)/3rdparty/tvm-ffi/3rdparty/dlpack/include \
	  -DAGOC_TVM_LIB_DIR=$(abspath $(RUNTIME_ANDROID)/lib) -DAGOC_COPY_RUNTIME=ON \
	  -DAGOC_OUTPUT_DIR=$(abspath $(RUNNER_OUT)/android-arm64-ndk)
	cmake --build $(RUNNER_OUT)/android-arm64-ndk/cmake -j $(RUNNER_JOBS)
	cp -f $$(find $(ANDROID_NDK_HOME)/toolchains/llvm/prebuilt -path '*aarch64-linux-android/libc++_shared.so' | head -1) \
	  $(RUNNER_OUT)/android-arm64-ndk/

runner-clean:
	rm -rf $(RUNNER_OUT) build/runtime-arm64 $(RUNTIME_ANDROID)
