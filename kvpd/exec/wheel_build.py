"""Builds kvpd's node wheel with the Python that will run it (stdlib only: it also runs on hosts).

    python -I wheel_build.py SRC OUT [--no-native]

SRC is a prepared source tree (kvpd.exec.wheel.prepare_source): `kvpd/` (the package files),
`dist-info/` (METADATA, entry_points.txt) and `pybind11/` (headers). The native core is compiled
straight with the host's C++ compiler, with the portable flags of setup.py; when that fails the
wheel is built without it (kvpd.native then uses the NumPy fallback) and the reason is printed.
The zip is deterministic (sorted entries, fixed timestamps), so one source and one toolchain
give one digest. Prints one JSON line: {"wheel", "digest", "native", "why"}.

Run as a script (not imported) so that a host needs nothing of kvpd to build it.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

NAME, VERSION = "kvpd", "0.1.0"
SOURCE = "kvpd/native/sparse_lru.cpp"
PORTABLE_MARCH = {"x86_64": "x86-64-v2", "amd64": "x86-64-v2", "aarch64": "armv8-a"}
EPOCH = (1980, 1, 1, 0, 0, 0)


def compiler() -> str | None:
    for cxx in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if cxx and shutil.which(cxx):
            return cxx
    return None


def compile_native(src: str, out_dir: str) -> tuple[str | None, str]:
    """(path of the built extension or None, what happened)."""
    cxx = compiler()
    if cxx is None:
        return None, "no C++ compiler (c++, g++, clang++) on this host"
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return None, f"no Python headers ({include}/Python.h; e.g. apt-get install python3-dev)"
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = os.path.join(out_dir, "_sparse_lru" + suffix)
    march = os.environ.get("KVPD_NATIVE_MARCH", "").strip() or PORTABLE_MARCH.get(
        platform.machine().lower(), ""
    )
    errors = []
    for flags in ([f"-march={march}"] if march else [], []):
        isa = " ".join(flags) or "compiler default"
        argv = [cxx, "-std=c++17", "-O3", "-fopenmp", *flags, "-fvisibility=hidden", "-g0"]
        argv += ["-shared", "-fPIC", f'-DKVPD_ISA_FLAGS="{isa}"', "-I", include]
        argv += ["-I", os.path.join(src, "pybind11"), os.path.join(src, SOURCE), "-o", target]
        argv += ["-fopenmp"] + (["-s"] if sys.platform == "linux" else [])
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode == 0:
            return target, f"built with {cxx} {isa}"
        errors.append(r.stderr.strip().splitlines()[-1:] or [f"exit {r.returncode}"])
    return None, f"{cxx} failed: {errors[-1][0][:300]}"


def tags(native: bool) -> str:
    if not native:
        return "py3-none-any"
    impl = sys.implementation.name
    py = ("cp" if impl == "cpython" else impl[:2]) + f"{sys.version_info[0]}{sys.version_info[1]}"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{py}-{py}-{plat}"


def record_line(arc: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arc},sha256={digest},{len(data)}"


def wheel_text(tag: str) -> bytes:
    """The WHEEL file of a kvpd wheel with this tag (pure when it is py3-none-any)."""
    purelib = str(tag == "py3-none-any").lower()
    return f"Wheel-Version: 1.0\nGenerator: kvpd\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n".encode()


def with_wheel_files(files: dict[str, bytes], tag: str) -> dict[str, bytes]:
    """The members plus the WHEEL and the RECORD computed from them."""
    info = f"{NAME}-{VERSION}.dist-info"
    out = {**files, f"{info}/WHEEL": wheel_text(tag)}
    record = [record_line(a, d) for a, d in sorted(out.items())] + [f"{info}/RECORD,,"]
    out[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    return out


def pack(files: dict[str, bytes], tag: str) -> bytes:
    """The wheel as bytes: the members (without WHEEL and RECORD, which are computed here) in a
    deterministic zip (sorted entries, fixed timestamps and modes)."""
    full = with_wheel_files(files, tag)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for arc in sorted(full):
            zi = zipfile.ZipInfo(arc, EPOCH)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, full[arc])
    return buf.getvalue()


def build(src: str, out: str, want_native: bool) -> dict[str, object]:
    work = tempfile.mkdtemp(prefix="kvpd-wheel-")
    try:
        ext, why = (None, "native core not wanted (--no-native)")
        if want_native:
            ext, why = compile_native(src, work)
        tag = tags(ext is not None)
        files: dict[str, bytes] = {}
        for root, dirs, names in os.walk(os.path.join(src, NAME)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for n in names:
                path = os.path.join(root, n)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, src).replace(os.sep, "/")] = f.read()
        if ext is not None:
            with open(ext, "rb") as f:
                files[f"{NAME}/native/{os.path.basename(ext)}"] = f.read()
        info = f"{NAME}-{VERSION}.dist-info"
        for n in sorted(os.listdir(os.path.join(src, "dist-info"))):
            with open(os.path.join(src, "dist-info", n), "rb") as f:
                files[f"{info}/{n}"] = f.read()
        os.makedirs(out, exist_ok=True)
        wheel = os.path.abspath(os.path.join(out, f"{NAME}-{VERSION}-{tag}.whl"))
        tmp = wheel + ".part"
        with open(tmp, "wb") as f:
            f.write(pack(files, tag))
        os.replace(tmp, wheel)
        with open(wheel, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        return {"wheel": wheel, "digest": digest, "native": ext is not None, "why": why}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 2:
        print("usage: wheel_build.py SRC OUT [--no-native]", file=sys.stderr)
        return 2
    print(json.dumps(build(args[0], args[1], "--no-native" not in argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
