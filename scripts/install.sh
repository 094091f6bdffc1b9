#!/usr/bin/env bash
# Installs the library, header and pkg-config file:  bash scripts/install.sh [PREFIX]   (default /usr/local)
# Afterwards:  cc app.c $(pkg-config --cflags --libs fastllm)
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${1:-/usr/local}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
cargo build --release -p fastllm
install -d "$PREFIX/lib" "$PREFIX/include" "$PREFIX/lib/pkgconfig"
install -m 644 include/fastllm.h "$PREFIX/include/"
install -m 755 target/release/libfastllm.so "$PREFIX/lib/"
install -m 644 target/release/libfastllm.a "$PREFIX/lib/"
cat > "$PREFIX/lib/pkgconfig/fastllm.pc" <<PC
prefix=$PREFIX
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: fastllm
Description: Portable LLM inference runtime (C ABI of fastllm-rs)
Version: $VERSION
Libs: -L\${libdir} -lfastllm
Libs.private: -lpthread -ldl -lm
Cflags: -I\${includedir}
PC
echo "installed fastllm $VERSION into $PREFIX (pkg-config: $PREFIX/lib/pkgconfig/fastllm.pc)"
