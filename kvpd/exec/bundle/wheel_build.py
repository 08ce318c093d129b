"""Builds kvpd's node wheel with the Python that will run it (stdlib only: it also runs on hosts).

    python -I wheel_build.py SRC OUT [--no-native]
    python -I wheel_build.py SRC OUT --prebuilt DIR --tag TAG --why TEXT

SRC is a prepared source tree (kvpd.exec.bundle.wheel.prepare_source): `kvpd/` (the package files),
`dist-info/` (METADATA, entry_points.txt) and `pybind11/` (headers). The native core (every
extension of kvpd/native/sources.py, the sparse-LRU core and vLLM-Ascend's planner interface) is
compiled straight with the host's C++ compiler, with the portable flags of setup.py; when that
fails the wheel is built without it (kvpd.native then uses the NumPy fallback) and the reason is
printed. With --prebuilt, the extension modules in DIR (cross-built on the controller for another
machine type) go into a wheel tagged TAG instead.
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
import sys
import sysconfig
import tempfile
import zipfile
from typing import Any

NAME = "kvpd"
EPOCH = (1980, 1, 1, 0, 0, 0)


def _version_in(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise SystemExit("wheel_build: no __version__ in kvpd/__init__.py")


def version(src: str) -> str:
    """kvpd's version: the `__version__ = "..."` line of the source tree's kvpd/__init__.py."""
    with open(os.path.join(src, NAME, "__init__.py")) as f:
        return _version_in(f.read())


def version_of(files: dict[str, bytes]) -> str:
    """kvpd's version, from the dist-info folder among a wheel's members (else from its
    kvpd/__init__.py)."""
    for name in files:
        head, _, rest = name.partition(".dist-info/")
        if rest and head.startswith(f"{NAME}-"):
            return head[len(NAME) + 1 :]
    return _version_in(files[f"{NAME}/__init__.py"].decode())


def native_sources(src: str) -> dict[str, Any]:
    """kvpd/native/sources.py of the source tree (the extensions and flags), loaded by path: this
    script imports nothing of kvpd."""
    path = os.path.join(src, NAME, "native", "sources.py")
    with open(path) as f:
        code = compile(f.read(), path, "exec")
    ns: dict[str, Any] = {"__name__": "kvpd_native_sources"}
    exec(code, ns)
    return ns


def compiler() -> str | None:
    for cxx in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if cxx and shutil.which(cxx):
            return cxx
    return None


def compile_native(src: str, out_dir: str) -> tuple[list[str] | None, str]:
    """(paths of the built extension modules, or None; what happened)."""
    cxx = compiler()
    if cxx is None:
        return None, "no C++ compiler (c++, g++, clang++) on this host"
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return None, f"no Python headers ({include}/Python.h; e.g. apt-get install python3-dev)"
    srcs = native_sources(src)
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    march = os.environ.get("KVPD_NATIVE_MARCH", "").strip() or srcs["PORTABLE_MARCH"].get(
        platform.machine().lower(), ""
    )
    errors = []
    for flags in ([f"-march={march}"] if march else [], []):
        isa = " ".join(flags)
        argv = [cxx, *srcs["BASE_FLAGS"], *flags, *srcs["TAIL_FLAGS"], *srcs["EXTRA_FLAGS"]]
        argv += ["-fPIC", srcs["isa_define"](isa), "-I", include]
        argv += ["-I", os.path.join(src, "pybind11")]
        link = list(srcs["LINK_FLAGS"])
        link = link if sys.platform == "linux" else [f for f in link if f != "-s"]
        built = [
            os.path.join(out_dir, module.rsplit(".", 1)[1] + suffix)
            for module in srcs["EXTENSIONS"]
        ]
        jobs = [
            ([os.path.join(src, f) for f in files], [cxx, "-shared"], [*link, "-o", target])
            for files, target in zip(srcs["EXTENSIONS"].values(), built, strict=True)
        ]
        code, out = srcs["compile_and_link"](argv, jobs, os.path.join(out_dir, "obj"))
        if code != 0:
            errors.append(out.strip().splitlines()[-1:] or [f"exit {code}"])
        else:
            return built, f"built with {cxx} {isa or 'compiler default'}"
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


def prebuilt_modules(folder: str) -> list[str]:
    """The extension modules in `folder` (kvpd/native's `_name.<suffix>.so` files)."""
    names = sorted(n for n in os.listdir(folder) if n.startswith("_") and n.endswith(".so"))
    return [os.path.join(folder, n) for n in names]


def wheel_text(tag: str) -> bytes:
    """The WHEEL file of a kvpd wheel with this tag (pure when it is py3-none-any)."""
    purelib = str(tag == "py3-none-any").lower()
    return f"Wheel-Version: 1.0\nGenerator: kvpd\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n".encode()


def with_wheel_files(files: dict[str, bytes], tag: str) -> dict[str, bytes]:
    """The members plus the WHEEL and the RECORD computed from them."""
    info = f"{NAME}-{version_of(files)}.dist-info"
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


def build(
    src: str,
    out: str,
    want_native: bool,
    prebuilt: str | None = None,
    tag: str | None = None,
    why: str | None = None,
) -> dict[str, object]:
    work = tempfile.mkdtemp(prefix="kvpd-wheel-")
    try:
        exts, what = (None, "native core not wanted (--no-native)")
        if prebuilt is not None:
            exts, what = prebuilt_modules(prebuilt) or None, why or "prebuilt"
        elif want_native:
            exts, what = compile_native(src, work)
        tag = tag if prebuilt is not None and tag else tags(exts is not None)
        files: dict[str, bytes] = {}
        for root, dirs, names in os.walk(os.path.join(src, NAME)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for n in names:
                path = os.path.join(root, n)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, src).replace(os.sep, "/")] = f.read()
        for ext in exts or ():
            with open(ext, "rb") as f:
                files[f"{NAME}/native/{os.path.basename(ext)}"] = f.read()
        ver = version(src)
        info = f"{NAME}-{ver}.dist-info"
        for n in sorted(os.listdir(os.path.join(src, "dist-info"))):
            with open(os.path.join(src, "dist-info", n), "rb") as f:
                files[f"{info}/{n}"] = f.read()
        os.makedirs(out, exist_ok=True)
        wheel = os.path.abspath(os.path.join(out, f"{NAME}-{ver}-{tag}.whl"))
        tmp = wheel + ".part"
        with open(tmp, "wb") as f:
            f.write(pack(files, tag))
        os.replace(tmp, wheel)
        with open(wheel, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        return {"wheel": wheel, "digest": digest, "native": exts is not None, "why": what}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    args, opts = [], {}
    words = iter(argv)
    for a in words:
        if a in ("--prebuilt", "--tag", "--why"):
            opts[a] = next(words, "")
        elif a.startswith("--"):
            opts[a] = ""
        else:
            args.append(a)
    if len(args) != 2 or ("--prebuilt" in opts and not opts.get("--tag")):
        print(
            "usage: wheel_build.py SRC OUT [--no-native | --prebuilt DIR --tag TAG --why TEXT]",
            file=sys.stderr,
        )
        return 2
    res = build(
        args[0], args[1], "--no-native" not in opts, opts.get("--prebuilt"), opts.get("--tag"),
        opts.get("--why"),
    )  # fmt: skip
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
