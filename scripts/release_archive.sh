#!/usr/bin/env bash
# Builds a release archive of inhook for one Linux target (docs/install.md):
#   scripts/release_archive.sh                                  # this machine's target
#   scripts/release_archive.sh aarch64-unknown-linux-gnu        # cross, see docs/install.md
# Writes target/archives/inhook-VERSION-TARGET.tar.gz (the binary, README, LICENSE notice and
# docs/) and its .sha256 beside it.
set -euo pipefail
cd "$(dirname "$0")/.."

host=$(rustc -vV | sed -n 's/^host: //p')
target=${1:-$host}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
name="inhook-$version-$target"

case "$target" in
    aarch64-unknown-linux-gnu)
        # The linker of Debian's gcc-aarch64-linux-gnu; the C parts (SQLite, ring) build with it too.
        export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER:-aarch64-linux-gnu-gcc}
        export CC_aarch64_unknown_linux_gnu=${CC_aarch64_unknown_linux_gnu:-aarch64-linux-gnu-gcc}
        ;;
esac

# The dist profile (Cargo.toml): fat LTO, one codegen unit, symbols stripped. This
# machine's own target builds where `cargo build --profile dist` puts it.
out=${CARGO_TARGET_DIR:-target}
if [ "$target" = "$host" ]; then
    cargo build --profile dist --locked --bin inhook
    built="$out/dist/inhook"
else
    cargo build --profile dist --locked --bin inhook --target "$target"
    built="$out/$target/dist/inhook"
fi

dist=target/archives
stage="$dist/$name"
rm -rf "$stage"
mkdir -p "$stage"
cp "$built" "$stage/"
cp README.md "$stage/"
cp -r docs "$stage/docs"
printf 'inhook %s for %s\nLicense: MIT OR Apache-2.0\n' "$version" "$target" > "$stage/LICENSE"
tar -C "$dist" -czf "$dist/$name.tar.gz" "$name"
(cd "$dist" && sha256sum "$name.tar.gz" > "$name.tar.gz.sha256")
rm -rf "$stage"
echo "$dist/$name.tar.gz"
