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
# the .pc file sets no rpath: say how a program finds libfastllm.so at run time
PC="PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig pkg-config --cflags --libs fastllm"
echo
echo "Build a program (the rpath lets it find libfastllm.so at run time):"
echo "  cc app.c \$($PC) -Wl,-rpath,$PREFIX/lib -o app"
if ldconfig -p 2>/dev/null | grep -qF "$PREFIX/lib/libfastllm.so"; then
  echo "(the dynamic loader already finds $PREFIX/lib/libfastllm.so, so the rpath is optional)"
else
  echo "Without the rpath, the loader must be told where the library is, either once as root"
  echo "(with $PREFIX/lib listed in /etc/ld.so.conf or /etc/ld.so.conf.d/):"
  echo "  ldconfig"
  echo "or for each run:"
  echo "  LD_LIBRARY_PATH=$PREFIX/lib ./app"
fi
