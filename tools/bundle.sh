#!/bin/sh
# Makes a relocatable bundle of an executable: the binary, every shared library it needs except
# the C runtime (glibc and its parts, libstdc++, libgcc_s) and the GPU driver (libcuda), and, when
# Open MPI's libmpi is among them, Open MPI's components, launcher and data files.
#
#   sh tools/bundle.sh BINARY OUTDIR          (make bundle: build/fsdp-run -> build/bundle)
#
# OUTDIR/NAME        the binary, with DT_RPATH $ORIGIN/lib: it runs without LD_LIBRARY_PATH
# OUTDIR/lib/        the libraries (each with RUNPATH $ORIGIN)
# OUTDIR/env.sh      sourced by the wrapper; sets LD_LIBRARY_PATH and Open MPI's relocation variables
# OUTDIR/NAME.sh     wrapper: sources env.sh and runs the binary (use it for multi-rank runs)
# OUTDIR/README      what is in the bundle and how to run it
# With Open MPI: lib/openmpi/ (MCA components), lib/pmix/ (PMIx plugins), bin/ (mpirun, orted),
# share/openmpi/ (help texts), etc/ (MCA parameter files).
#
# FSDP_BUNDLE_CUDA=1      also bundle the CUDA toolkit's libraries (by default the target's own are used:
#                         a CUDA install or PyTorch's nvidia-* wheels, found by env.sh)
# FSDP_BUNDLE_STRIP=1     strip debug information from everything copied
# FSDP_BUNDLE_EXTRA="FILE=SUBDIR ..."  more executables / plugins, copied to OUTDIR/SUBDIR with an rpath
#                         to OUTDIR/lib (tools/gpu_kit.sh bundles the tests and benchmarks this way)
#
# The rpath is set with patchelf (tools/setup.sh installs it). Without patchelf the binary is
# relinked with FSDP_BUNDLE_LINK, the link command `make bundle` passes (its object files and
# libraries, without -o); the libraries then keep their RUNPATH and env.sh's LD_LIBRARY_PATH finds
# them for the wrapper.
set -eu

die() {
    echo "bundle: $*" >&2
    exit 1
}

[ $# -eq 2 ] || {
    echo "usage: sh tools/bundle.sh BINARY OUTDIR" >&2
    exit 2
}
bin=$1
out=$2
[ -f "$bin" ] && [ -x "$bin" ] || die "$bin is not an executable file"
command -v ldd >/dev/null 2>&1 || die "ldd is not installed"
# FSDP_BUNDLE_PATCHELF overrides the patchelf to use ("" forces the relink path).
PATCHELF=${FSDP_BUNDLE_PATCHELF-$(command -v patchelf 2>/dev/null || true)}
if [ -z "$PATCHELF" ] && [ -z "${FSDP_BUNDLE_LINK:-}" ]; then
    die "patchelf is not installed (run tools/setup.sh) and no FSDP_BUNDLE_LINK link command was given (use make bundle)"
fi
name=$(basename "$bin")
case "$out" in
"" | / | .) die "refusing to use '$out' as the output directory" ;;
esac

rm -rf "$out"
mkdir -p "$out/lib"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-bundle.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

# Libraries every Linux host provides (glibc and its parts, the C++ and gcc runtimes) and the GPU
# driver, which must come from the host it runs on.
is_system() {
    case "$1" in
    linux-vdso.so* | linux-gate.so* | ld-linux*.so* | libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | \
        librt.so.* | libutil.so.* | libresolv.so.* | libanl.so.* | libnsl.so.* | libmvec.so.* | \
        libBrokenLocale.so.* | libstdc++.so.* | libgcc_s.so.* | libcuda.so* | libnvidia-*.so*)
        return 0
        ;;
    esac
    return 1
}

# The CUDA toolkit's libraries (cuBLAS, cuBLASLt, NCCL, cuDNN, the runtime): about 800 MB, and every
# GPU machine has its own (a CUDA install, or the nvidia-* Python wheels next to PyTorch), which
# env.sh finds. FSDP_BUNDLE_CUDA=1 bundles them too.
is_cuda_toolkit() {
    [ "${FSDP_BUNDLE_CUDA:-0}" = 1 ] && return 1
    case "$1" in
    libcudart.so* | libcublas.so* | libcublasLt.so* | libnccl.so* | libcudnn*.so* | libnvrtc*.so* | \
        libnvJitLink.so* | libcurand.so* | libcufft*.so* | libcusparse*.so* | libcusolver*.so*)
        return 0
        ;;
    esac
    return 1
}

# copy_deps FILE: copies the non-system libraries FILE needs (ldd lists the whole closure) to lib/.
copy_deps() {
    ldd "$1" >"$tmp/ldd.txt" 2>&1 || true # a static file makes ldd fail: nothing to copy
    if grep -q "=> not found" "$tmp/ldd.txt"; then
        grep "=> not found" "$tmp/ldd.txt" >&2
        die "$1 needs libraries that cannot be found"
    fi
    awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' "$tmp/ldd.txt" >"$tmp/deps.txt"
    while read -r so path; do
        is_system "$so" && continue
        is_cuda_toolkit "$so" && continue
        [ -e "$out/lib/$so" ] && continue
        cp -L "$path" "$out/lib/$so"
        chmod u+w "$out/lib/$so"
        if [ "${FSDP_BUNDLE_STRIP:-0}" = 1 ]; then strip --strip-debug "$out/lib/$so" 2>/dev/null || true; fi
    done <"$tmp/deps.txt"
}

# set_runpath FILE VALUE: RUNPATH of a library (nothing without patchelf: env.sh's
# LD_LIBRARY_PATH then finds the libraries).
set_runpath() {
    [ -n "$PATCHELF" ] || return 0
    cur=$("$PATCHELF" --print-rpath "$1" 2>/dev/null || true)
    [ "$cur" = "$2" ] && return 0
    "$PATCHELF" --set-rpath "$2" "$1"
}

# ---- the binary ------------------------------------------------------------------------------------
# Unbundled CUDA libraries are also looked for where a CUDA install puts them.
RPATH_CUDA=""
if [ "${FSDP_BUNDLE_CUDA:-0}" != 1 ]; then RPATH_CUDA=":/usr/local/cuda/lib64"; fi
RPATH_MAIN="\$ORIGIN/lib$RPATH_CUDA"
copy_deps "$bin"
cp "$tmp/ldd.txt" "$tmp/ldd-bin.txt"
# NCCL and cuBLAS(Lt) are dlopened (runtime/nccl_api.c, runtime/device_blas.c) and the CUDA runtime is
# linked statically, so ldd lists none of them: with FSDP_BUNDLE_CUDA=1 they are copied from the first
# directory of the binary's RPATH/RUNPATH (where the loader finds them when it runs) that has them.
if [ "${FSDP_BUNDLE_CUDA:-0}" = 1 ]; then
    search=$(readelf -d "$bin" 2>/dev/null | sed -n 's/.*(R[UN]*PATH).*\[\(.*\)\]$/\1/p' | tr ':' '\n' |
        sed "s|^\$ORIGIN|$(dirname "$bin")|")
    for pat in 'libnccl.so.[0-9]*' 'libcublas.so.[0-9]*' 'libcublasLt.so.[0-9]*'; do
        found=""
        for d in $search; do
            for f in "$d"/$pat; do
                case "$(basename "$f")" in *.so.[0-9] | *.so.[0-9][0-9]) ;; *) continue ;; esac
                [ -e "$f" ] || continue
                found=$f
                [ -e "$out/lib/$(basename "$f")" ] && continue
                cp -L "$f" "$out/lib/" && chmod u+w "$out/lib/$(basename "$f")"
            done
            [ -n "$found" ] && break
        done
        [ -n "$found" ] || die "FSDP_BUNDLE_CUDA=1 but no $pat is in the binary's library path ($(echo $search)); a build without CUDA needs no FSDP_BUNDLE_CUDA"
    done
fi
if [ -n "$PATCHELF" ]; then
    cp "$bin" "$out/$name"
    chmod u+w "$out/$name"
    # DT_RPATH (not RUNPATH): it also applies to the libraries' own dependencies and dlopen.
    "$PATCHELF" --force-rpath --set-rpath "$RPATH_MAIN" "$out/$name"
else
    echo "bundle: patchelf not found, relinking $name with rpath \$ORIGIN/lib" >&2
    eval "set -- $FSDP_BUNDLE_LINK"
    linker=$1
    shift
    # first on the command line, so first in DT_RPATH
    "$linker" -Wl,--disable-new-dtags -Wl,-rpath,"$RPATH_MAIN" "$@" -o "$out/$name"
fi
if [ "${FSDP_BUNDLE_STRIP:-0}" = 1 ]; then strip --strip-debug "$out/$name"; fi
for f in "$out"/lib/*; do
    [ -f "$f" ] && set_runpath "$f" '$ORIGIN'
done

# ---- extra executables and plugins ---------------------------------------------------------------------
# FSDP_BUNDLE_EXTRA="FILE=SUBDIR ...": each FILE is copied to OUTDIR/SUBDIR with an rpath to OUTDIR/lib
# and its libraries bundled (tests, benchmarks and plugins next to the program). Needs patchelf.
for spec in ${FSDP_BUNDLE_EXTRA:-}; do
    f=${spec%%=*}
    sub=${spec#*=}
    [ "$sub" = "$spec" ] && sub=.
    [ -f "$f" ] || die "extra file $f does not exist"
    [ -n "$PATCHELF" ] || die "extra files (FSDP_BUNDLE_EXTRA) need patchelf"
    case "$sub" in /* | *..*) die "extra subdirectory '$sub' must be relative and inside the bundle" ;; esac
    mkdir -p "$out/$sub"
    copy_deps "$f"
    dst="$out/$sub/$(basename "$f")"
    cp "$f" "$dst"
    chmod u+w "$dst"
    if [ "${FSDP_BUNDLE_STRIP:-0}" = 1 ]; then strip --strip-debug "$dst"; fi
    up=$(printf '%s\n' "$sub" | awk -F/ '{ n = 0; for (i = 1; i <= NF; i++) if ($i != "" && $i != ".") n++;
                                           s = ""; for (i = 0; i < n; i++) s = s "../"; print s }')
    case "$dst" in
    *.so) "$PATCHELF" --set-rpath "\$ORIGIN/${up}lib" "$dst" ;;
    *) "$PATCHELF" --force-rpath --set-rpath "\$ORIGIN/${up}lib$RPATH_CUDA" "$dst" ;;
    esac
done
for f in "$out"/lib/*; do # libraries the extras added
    [ -f "$f" ] && set_runpath "$f" '$ORIGIN'
done

# ---- Open MPI ----------------------------------------------------------------------------------------
mpi=""
for f in "$out"/lib/libmpi.so.*; do
    [ -f "$f" ] && mpi=$f && break
done
if [ -n "$mpi" ]; then
    mpi_src=$(awk '$1 ~ /^libmpi\.so\./ && $2 == "=>" { print $3; exit }' "$tmp/ldd-bin.txt")
    mpi_real=$(readlink -f "$mpi_src")
    mpi_libdir=$(dirname "$mpi_real")
    pkglibdir=""
    if command -v ompi_info >/dev/null 2>&1; then
        pkglibdir=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n 's/^path:pkglibdir://p' || true)
    fi
    for cand in "$pkglibdir" "$mpi_libdir/openmpi3" "$mpi_libdir/openmpi" "$mpi_libdir/openmpi/lib/openmpi3"; do
        if [ -n "$cand" ] && ls "$cand"/mca_*.so >/dev/null 2>&1; then
            pkglibdir=$cand
            break
        fi
        pkglibdir=""
    done
    [ -n "$pkglibdir" ] || die "libmpi is bundled but Open MPI's component directory (mca_*.so) was not found"
    mkdir -p "$out/lib/openmpi"
    cp -L "$pkglibdir"/*.so "$out/lib/openmpi/"
    for c in "$out"/lib/openmpi/*.so; do
        chmod u+w "$c"
        copy_deps "$c"
        set_runpath "$c" '$ORIGIN/..'
    done
    # PMIx (Open MPI 4 built with an external PMIx) loads its own plugins.
    if [ -f "$out/lib/libpmix.so.2" ]; then
        pmix_src=$(ldd "$pkglibdir"/*pmix*.so 2>/dev/null | awk '$1 ~ /^libpmix\.so/ && $3 ~ /^\// { print $3; exit }')
        pmix_plugins=""
        [ -n "$pmix_src" ] && pmix_plugins=$(dirname "$(readlink -f "$pmix_src")")/pmix
        if [ -n "$pmix_plugins" ] && ls "$pmix_plugins"/*.so >/dev/null 2>&1; then
            mkdir -p "$out/lib/pmix"
            cp -L "$pmix_plugins"/*.so "$out/lib/pmix/"
            for c in "$out"/lib/pmix/*.so; do
                chmod u+w "$c"
                copy_deps "$c"
                set_runpath "$c" '$ORIGIN/..'
            done
        fi
    fi
    # the launcher and the daemon it starts on every node
    mkdir -p "$out/bin"
    bindir=""
    if command -v ompi_info >/dev/null 2>&1; then
        bindir=$(ompi_info --path bindir --parsable 2>/dev/null | sed -n 's/^path:bindir://p' || true)
    fi
    for tool in orterun orted mpirun; do
        src=""
        [ -n "$bindir" ] && [ -x "$bindir/$tool" ] && src="$bindir/$tool"
        [ -z "$src" ] && src=$(command -v "$tool" 2>/dev/null || true)
        [ -n "$src" ] || continue
        cp -L "$src" "$out/bin/$tool"
        chmod u+w "$out/bin/$tool"
        copy_deps "$out/bin/$tool"
        if [ -n "$PATCHELF" ]; then "$PATCHELF" --force-rpath --set-rpath '$ORIGIN/../lib' "$out/bin/$tool"; fi
    done
    for f in "$out"/lib/*; do # libraries the components and tools added
        [ -f "$f" ] && set_runpath "$f" '$ORIGIN'
    done
    if command -v ompi_info >/dev/null 2>&1; then
        datadir=$(ompi_info --path pkgdatadir --parsable 2>/dev/null | sed -n 's/^path:pkgdatadir://p' || true)
        confdir=$(ompi_info --path sysconfdir --parsable 2>/dev/null | sed -n 's/^path:sysconfdir://p' || true)
        if [ -n "$datadir" ] && [ -d "$datadir" ]; then
            mkdir -p "$out/share/openmpi"
            cp -RL "$datadir"/. "$out/share/openmpi/"
        fi
        if [ -n "$confdir" ] && [ -d "$confdir" ]; then
            mkdir -p "$out/etc"
            cp -RL "$confdir"/. "$out/etc/"
        fi
    fi
fi

# ---- environment, wrapper, README ----------------------------------------------------------------------
{
    echo '# Environment of this bundle (generated by tools/bundle.sh). Source it from the bundle directory'
    echo '# (cd bundle && . ./env.sh), from bash, or with FSDP_BUNDLE_DIR set to the bundle directory.'
    echo 'if [ -z "${FSDP_BUNDLE_DIR:-}" ]; then'
    echo '    if [ -n "${BASH_SOURCE:-}" ]; then FSDP_BUNDLE_DIR=$(cd "$(dirname "$BASH_SOURCE")" && pwd); else FSDP_BUNDLE_DIR=$PWD; fi'
    echo 'fi'
    echo 'B=$FSDP_BUNDLE_DIR'
    echo '[ -f "$B/env.sh" ] || echo "env.sh: $B is not the bundle directory (set FSDP_BUNDLE_DIR)" >&2'
    echo 'export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"'
    if [ "${FSDP_BUNDLE_CUDA:-0}" != 1 ]; then
        echo '# The CUDA libraries (not bundled) come from this machine: a CUDA install, then the nvidia-*'
        echo '# wheels of the python3 on PATH (PyTorch ships cuBLAS, NCCL and cuDNN that way).'
        echo 'for d in ${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do'
        echo '    [ -d "$d" ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"'
        echo 'done'
        echo 'if command -v python3 >/dev/null 2>&1; then'
        echo '    for d in $(python3 -c "import nvidia, glob; print(\" \".join(d for p in nvidia.__path__ for d in sorted(glob.glob(p + \"/*/lib\"))))" 2>/dev/null); do'
        echo '        LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"'
        echo '    done'
        echo 'fi'
        echo 'export LD_LIBRARY_PATH'
    fi
    if [ -n "$mpi" ]; then
        echo '# Open MPI: find the bundled components, help texts and parameter files instead of the build host paths.'
        echo 'export OPAL_PREFIX="$B" OPAL_EXEC_PREFIX="$B" OPAL_BINDIR="$B/bin" OPAL_LIBDIR="$B/lib"'
        echo 'export OPAL_PKGLIBDIR="$B/lib/openmpi" OPAL_DATAROOTDIR="$B/share" OPAL_DATADIR="$B/share"'
        echo 'export OPAL_PKGDATADIR="$B/share/openmpi" OPAL_SYSCONFDIR="$B/etc"'
        echo 'export OMPI_MCA_mca_base_component_path="$B/lib/openmpi"'
        [ -d "$out/lib/pmix" ] && echo 'export PMIX_MCA_mca_base_component_path="$B/lib/pmix"'
        echo 'export PATH="$B/bin:$PATH"'
    fi
} >"$out/env.sh"

cat >"$out/$name.sh" <<EOF
#!/bin/sh
# Runs the bundled $name with the environment of env.sh (generated by tools/bundle.sh).
FSDP_BUNDLE_DIR=\$(cd "\$(dirname "\$0")" && pwd)
. "\$FSDP_BUNDLE_DIR/env.sh"
exec "\$FSDP_BUNDLE_DIR/$name" "\$@"
EOF
chmod +x "$out/$name.sh"

{
    echo "$name bundle (made by tools/bundle.sh on $(uname -n), $(date -u +%Y-%m-%d))"
    echo
    echo "  $name          the program; finds its libraries in lib/ through its rpath (\$ORIGIN/lib)"
    echo "  $name.sh       runs $name with env.sh's environment"
    echo "  env.sh         LD_LIBRARY_PATH and Open MPI's relocation variables for this directory"
    echo "  lib/           the shared libraries it needs, except glibc, libstdc++, libgcc_s and the NVIDIA"
    echo "                 driver (libcuda.so.1), which the host must provide"
    if [ -n "$mpi" ]; then
        echo "  lib/openmpi/   Open MPI's MCA components;  bin/  mpirun, orterun, orted"
        [ -d "$out/lib/pmix" ] && echo "  lib/pmix/      PMIx plugins"
        echo "  share/, etc/   Open MPI's help texts and MCA parameter files"
        echo
        echo "Open MPI looks for its components where it was installed on the build host. The bundle moves"
        echo "them with OPAL_PREFIX, OPAL_*DIR and OMPI_MCA_mca_base_component_path, all set by env.sh."
    fi
    echo
    echo "Run on one process:"
    echo "  ./$name.sh recipe.yaml          (./$name recipe.yaml also works when MPI is not initialised)"
    if [ -n "$mpi" ]; then
        echo "Run on several processes with the bundled Open MPI (same path on every node):"
        echo "  . ./env.sh && mpirun --prefix \"\$PWD\" -x LD_LIBRARY_PATH -x OPAL_PREFIX -np 8 ./$name.sh recipe.yaml"
        echo "With a cluster's own launcher (srun, another mpirun), its Open MPI must be compatible with the"
        echo "bundled one; start $name.sh so that every rank gets env.sh's environment."
    fi
    echo "The host needs a glibc at least as new as the build host's and, for GPU runs, an NVIDIA driver"
    echo "supporting the bundled CUDA runtime."
} >"$out/README"

echo "bundle: $out/$name with $(ls "$out/lib" | wc -l | tr -d ' ') entries in lib/"
