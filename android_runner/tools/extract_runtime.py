"""Unpack the aarch64 TVM runtime from the PyPI wheels into build/runtime-arm64/.

    python3 extract_runtime.py WHEEL_DIR OUT_DIR

Writes OUT_DIR/lib/{libtvm_runtime.so, libtvm_runtime_extra.so, libtvm_ffi.so} and
OUT_DIR/include/ (the tvm_ffi headers and dlpack), then checks that the runtime registers
what the runner looks up by name. Standard library only; idempotent.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

# wheel name prefix -> members to take (exact paths, or a folder ending in "/")
MEMBERS = {
    "apache_tvm-": ["tvm/lib/libtvm_runtime.so", "tvm/lib/libtvm_runtime_extra.so"],
    "apache_tvm_ffi-": ["tvm_ffi/lib/libtvm_ffi.so", "tvm_ffi/include/"],
}
# where a member lands under OUT_DIR: strip the package prefix
DESTINATIONS = {"tvm/lib/": "lib/", "tvm_ffi/lib/": "lib/", "tvm_ffi/include/": "include/"}
# names the runner needs to find registered in the runtime (as strings in its .rodata)
REQUIRED = {
    "lib/libtvm_runtime.so": [b"rpc.ServerLoop", b"ffi.Module.load_from_bytes.relax.VMExecutable"],
    "lib/libtvm_runtime_extra.so": [b"tvm.contrib.random.random_fill_for_measure"],
}


def wheel(wheel_dir: Path, prefix: str) -> Path:
    found = sorted(wheel_dir.glob(f"{prefix}*aarch64*.whl"))
    if not found:
        sys.exit(f"extract_runtime: no {prefix}*aarch64*.whl in {wheel_dir} (run `make runtime-arm64`)")
    return found[-1]


def destination(member: str) -> str:
    for source, target in DESTINATIONS.items():
        if member.startswith(source):
            return target + member[len(source):]
    raise ValueError(member)


def extract(wheel_path: Path, wanted: list[str], out: Path) -> None:
    with zipfile.ZipFile(wheel_path) as archive:
        names = archive.namelist()
        for want in wanted:
            is_folder = want.endswith("/")
            members = [n for n in names if n.startswith(want) and not n.endswith("/")] if is_folder else [want]
            if not members or members[0] not in names:
                sys.exit(f"extract_runtime: {wheel_path.name} has no {want}")
            for member in members:
                target = out / destination(member)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(member))


def main() -> None:
    wheel_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    for prefix, wanted in MEMBERS.items():
        extract(wheel(wheel_dir, prefix), wanted, out)
    for library, names in REQUIRED.items():
        data = (out / library).read_bytes()
        if data[:4] != b"\x7fELF" or int.from_bytes(data[18:20], "little") != 183:
            sys.exit(f"extract_runtime: {library} is not an aarch64 ELF file")
        missing = [n.decode() for n in names if n not in data]
        if missing:
            sys.exit(f"extract_runtime: {library} does not register {', '.join(missing)}")
    print(f"aarch64 TVM runtime in {out}/lib, headers in {out}/include")


if __name__ == "__main__":
    main()
