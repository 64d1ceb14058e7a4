#!/usr/bin/env bash
# Release archives for Linux x86-64, in target/dist/:
#
#   runner-VERSION-x86_64-unknown-linux-gnu.tar.gz    glibc build, starts on glibc 2.17 and newer
#   runner-VERSION-x86_64-unknown-linux-musl.tar.gz   static build, no C library needed
#   SHA256SUMS
#
#   bash scripts/release.sh              # both archives
#   bash scripts/release.sh gnu          # one of them (gnu | musl)
#
# The glibc floor is declared, not inherited from the build machine: both builds link with
# Zig's toolchain through cargo-zigbuild, which targets an exact glibc version. The tools come
# from the package registries into target/release-tools/ (ziglang from PyPI, cargo-zigbuild
# from crates.io); the musl standard library comes from rustup (`rustup target add
# x86_64-unknown-linux-musl`, done here when missing). Each binary is checked before it is
# packed: it runs `--version` and validates the shipped workflows, the glibc build needs no
# symbol newer than its floor, the musl build has no dynamic section.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
GLIBC_FLOOR=2.17
TOOLS="$ROOT/target/release-tools"
DIST="$ROOT/target/dist"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
log() { printf '%s\n' "$*" >&2; }

flavours=("$@")
[[ ${#flavours[@]} -gt 0 ]] || flavours=(gnu musl)
for f in "${flavours[@]}"; do
    [[ $f == gnu || $f == musl ]] || { log "unknown flavour '$f' (gnu or musl)"; exit 2; }
done

# 1. Tools, pinned.
if [[ ! -x "$TOOLS/venv/bin/python" ]] || ! "$TOOLS/venv/bin/python" -m ziglang version >/dev/null 2>&1; then
    log "installing ziglang into $TOOLS/venv"
    python3 -m venv "$TOOLS/venv"
    "$TOOLS/venv/bin/pip" install --quiet ziglang==0.13.0
fi
if [[ ! -x "$TOOLS/bin/cargo-zigbuild" ]]; then
    log "installing cargo-zigbuild into $TOOLS"
    cargo install --quiet --locked cargo-zigbuild@0.24.1 --root "$TOOLS"
fi
# cargo-zigbuild runs Zig as `python3 -m ziglang` when no `zig` is on PATH.
export PATH="$TOOLS/bin:$TOOLS/venv/bin:$PATH"

mkdir -p "$DIST"
: > "$DIST/SHA256SUMS.new"

for flavour in "${flavours[@]}"; do
    case $flavour in
        gnu)  target=x86_64-unknown-linux-gnu;  zigtarget="$target.$GLIBC_FLOOR" ;;
        musl) target=x86_64-unknown-linux-musl; zigtarget="$target"
              rustup target list --installed | grep -qx "$target" || rustup target add "$target" ;;
    esac
    log "building $target"
    cargo zigbuild --release --locked --bin runner --target "$zigtarget"
    bin="target/$target/release/runner"

    # 2. Check the binary before packing it.
    "$bin" --version >/dev/null
    "$bin" validate workflows/ >/dev/null
    case $flavour in
        gnu)
            newest="$(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
            if [[ "$(printf '%s\n%s\n' "GLIBC_$GLIBC_FLOOR" "$newest" | sort -V | tail -1)" != "GLIBC_$GLIBC_FLOOR" ]]; then
                log "$bin needs $newest, newer than the declared floor glibc $GLIBC_FLOOR"
                exit 1
            fi
            log "  needs at most $newest" ;;
        musl)
            if readelf -d "$bin" 2>/dev/null | grep -q NEEDED; then
                log "$bin is not static: $(readelf -d "$bin" | grep NEEDED)"
                exit 1
            fi
            log "  static" ;;
    esac

    # 3. Pack: the binary, the docs a user reads first, the workflow JSON Schema for editors.
    name="runner-$VERSION-$target"
    stage="$(mktemp -d)"
    mkdir -p "$stage/$name"
    cp "$bin" "$stage/$name/runner"
    strip "$stage/$name/runner"
    cp README.md "$stage/$name/"
    cp -r docs "$stage/$name/docs"
    cp schemas/workflow.schema.json "$stage/$name/"
    tar -C "$stage" -czf "$DIST/$name.tar.gz" --owner=0 --group=0 "$name"
    rm -rf "$stage"
    (cd "$DIST" && sha256sum "$name.tar.gz") >> "$DIST/SHA256SUMS.new"
    log "  $DIST/$name.tar.gz"
done
mv "$DIST/SHA256SUMS.new" "$DIST/SHA256SUMS"
cat "$DIST/SHA256SUMS"
