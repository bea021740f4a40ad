#!/usr/bin/env bash
# llama.cpp's own C++ server (llama-server), the yardstick of the benchmarks: the decode speed of the same GGUF
# (benchmarks/decode_formats.py) and many readers at once through its parallel slots (benchmarks/load.py).
# llama-cpp-python's Python server, which scripts/engine.sh builds for the relay, answers one request at a
# time; llama-server batches its slots, as our engine does. Built from the llama.cpp sources vendored in the
# same pinned llama-cpp-python sdist (PyPI is the only registry these machines reach), the server target only,
# into $VENV/bin/llama-server. ~10 min on 2 cores at nice 19. Idempotent.
#
#   bash scripts/llama_server.sh          # or: make engine (which also runs scripts/engine.sh)
#
# The build is for this CPU (GGML_NATIVE): build it on the machine that runs it. CMAKE_ARGS are passed on.
# A yardstick for another kind of CPU (an AVX2 machine's, on an AVX-512 one), into a folder of its own, which
# the benchmarks then take from STREAMLAB_ENGINE_VENV:
#   STREAMLAB_ENGINE_VENV=/tmp/engine-avx2 GGML_NATIVE=OFF CMAKE_ARGS="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
#     -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF" bash scripts/llama_server.sh
set -euo pipefail

VERSION=0.3.36
cd "$(dirname "$0")/.."
VENV=${STREAMLAB_ENGINE_VENV:-.venv-engine}
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] && PIP_PYTHON=.venv/bin/python || PIP_PYTHON=$PYTHON
SRC="$VENV/src"
BIN="$VENV/bin/llama-server"
STAMP="$VENV/bin/.llama-server-$VERSION"
started=$(date +%s)

if [ -x "$BIN" ] && [ -e "$STAMP" ]; then
  echo "streamlab: $BIN already built (llama.cpp of llama-cpp-python $VERSION)"
  exit 0
fi
for tool in cmake g++; do
  command -v "$tool" >/dev/null || { echo "streamlab: llama-server needs $tool (apt-get install cmake build-essential)" >&2; exit 1; }
done
mkdir -p "$SRC" "$VENV/bin"
tarball=$(ls "$SRC"/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || true)
if [ -z "$tarball" ]; then
  echo "streamlab: fetching the llama-cpp-python $VERSION sdist (its vendored llama.cpp) from PyPI"
  "$PIP_PYTHON" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$SRC"
  tarball="$SRC/llama_cpp_python-$VERSION.tar.gz"
fi
tree="$SRC/llama_cpp_python-$VERSION"
[ -d "$tree/vendor/llama.cpp/tools/server" ] || tar -xzf "$tarball" -C "$SRC"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
echo "streamlab: building llama-server (progress in $SRC/build.log)"
# shellcheck disable=SC2086
cmake -S "$tree/vendor/llama.cpp" -B "$SRC/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE="${GGML_NATIVE:-ON}" ${CMAKE_ARGS:-} \
  >"$SRC/build.log" 2>&1 || { tail -30 "$SRC/build.log" >&2; exit 1; }
nice -n 19 cmake --build "$SRC/build" --target llama-server -j "$(nproc)" >>"$SRC/build.log" 2>&1 \
  || { tail -30 "$SRC/build.log" >&2; exit 1; }
cp "$SRC/build/bin/llama-server" "$BIN"
touch "$STAMP"
elapsed=$(( $(date +%s) - started ))
printf 'streamlab: %s ready after %dm%02ds\n' "$BIN" $((elapsed / 60)) $((elapsed % 60))
