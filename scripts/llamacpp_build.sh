#!/usr/bin/env bash
# llama.cpp from PyPI: the `llama-cpp-python` sdist vendors llama.cpp's whole source (vendor/llama.cpp). For each
# version named, this unpacks that source into the user cache (read by the tests that check eaglewire's llama.cpp
# rules against its own code) and, for the first version only, builds llama-server there (served by the tests that
# run our GGUF exports in real llama.cpp). Each version is done once; a finished one is kept.
#   bash scripts/llamacpp_build.sh [VERSION ...] && export EAGLEWIRE_LLAMACPP=~/.cache/eaglewire/llamacpp
# Layout: $D/<version>/src (llama.cpp's source), $D/<version>/bin/llama-server (the first version's build).
# LLAMACPP_TOOLS="llama-batched-bench ..." builds more of llama.cpp's tools beside llama-server (the benchmarks'
# step costs, benchmarks/llamacpp/parts.py); CI builds llama-server alone. A tool already built is kept.
# CPU features come from /proc/cpuinfo at build time, never -march=native: AMX stays off, since on some VMs the
# CPU flags list AMX while the kernel does not grant its tile state and ggml's AMX kernels die with SIGILL.
set -euo pipefail
D="${EAGLEWIRE_LLAMACPP:-${EAGLEWIRE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eaglewire}/llamacpp}"
PY="${PYTHON:-python3}"
VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(0.3.36 0.3.30)   # the newest read release first: it is the one built
mkdir -p "$D"

unpack() {  # $1 version -> $D/$1/src
    local v="$1" tmp
    [ -f "$D/$v/src/CMakeLists.txt" ] && return 0
    tmp="$(mktemp -d)"
    "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$v" -d "$tmp"
    mkdir -p "$tmp/x" && tar -xzf "$tmp"/llama_cpp_python-"$v".tar.gz -C "$tmp/x"
    rm -rf "$D/$v/src" && mkdir -p "$D/$v" && mv "$tmp/x/llama_cpp_python-$v/vendor/llama.cpp" "$D/$v/src"
    rm -rf "$tmp"
}

build() {  # $1 version -> $D/$1/bin/llama-server (and $LLAMACPP_TOOLS)
    local v="$1" flags f t missing=()
    for t in llama-server ${LLAMACPP_TOOLS:-}; do [ -x "$D/$v/bin/$t" ] || missing+=("$t"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    flags="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    for f in avx avx2 fma f16c avx512f avx512_vnni avx512_bf16 avx512vbmi; do
        if grep -qw "$f" /proc/cpuinfo; then
            case "$f" in
                avx512f) flags="$flags -DGGML_AVX512=ON" ;;
                avx512vbmi) flags="$flags -DGGML_AVX512_VBMI=ON" ;;
                avx512_vnni) flags="$flags -DGGML_AVX512_VNNI=ON" ;;
                avx512_bf16) flags="$flags -DGGML_AVX512_BF16=ON" ;;
                *) flags="$flags -DGGML_${f^^}=ON" ;;
            esac
        fi
    done
    local gen="" ; command -v ninja >/dev/null && gen="-G Ninja"
    # shellcheck disable=SC2086
    cmake -S "$D/$v/src" -B "$D/$v/build" $gen -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF $flags >"$D/$v/cmake.log" 2>&1 \
        || { tail -30 "$D/$v/cmake.log"; exit 1; }
    cmake --build "$D/$v/build" --target "${missing[@]}" -j "$(nproc)" >"$D/$v/build.log" 2>&1 \
        || { tail -30 "$D/$v/build.log"; exit 1; }
    mkdir -p "$D/$v/bin"
    for t in "${missing[@]}"; do
        cp "$D/$v/build/bin/$t" "$D/$v/bin/$t.tmp" && mv "$D/$v/bin/$t.tmp" "$D/$v/bin/$t"   # present only once whole
    done
    echo "$flags" >"$D/$v/bin/cmake-flags.txt"
    rm -rf "$D/$v/build"
}

for v in "${VERSIONS[@]}"; do unpack "$v"; done
# the converter (convert_hf_to_gguf.py, run by tests/export/test_llamacpp_converter.py with its own gguf-py) imports
# sentencepiece even for a BPE tokenizer; it lives beside the sources, not in the project's venv
[ -d "$D/converter-deps/sentencepiece" ] || "$PY" -m pip install -q --target "$D/converter-deps" "sentencepiece>=0.1.98,<0.3.0"
build "${VERSIONS[0]}"
echo "llama.cpp sources: ${VERSIONS[*]}; llama-server ${VERSIONS[0]}: $D/${VERSIONS[0]}/bin/llama-server"
