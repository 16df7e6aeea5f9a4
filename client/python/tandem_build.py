"""The tandem Python SDK's build backend (PEP 517 and PEP 660), in the standard library only.

pip builds a package in an isolated environment and first installs the backend's
requirements there; setuptools from an index is what made `pip install ./client/python`
fail offline. This backend needs nothing to be installed, so a plain
`pip install ./client/python` works without a network wherever the runtime dependencies
(grpcio, protobuf) are already present (e.g. a venv made with --system-site-packages over
Debian's python3-grpcio and python3-protobuf).

The gRPC stubs of tandem/v1/inference.proto are generated into the wheel: with grpcio-tools
when it is importable, else with protoc and grpc_python_plugin on PATH (Debian:
protobuf-compiler protobuf-compiler-grpc). The proto is found at $TANDEM_PROTO_DIR, in the
sdist's protos/, or at ../../protos (a repository checkout).
"""

import base64
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

NAME = "tandem_client"
VERSION = "0.1.0"
REQUIRES = ["grpcio>=1.51", "protobuf>=3.20"]
SUMMARY = "Python client for the tandem MoE inference server (tandem.v1.Inference over gRPC)"
PYTHON = ">=3.9"
HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join("tandem", "v1", "inference.proto")
PACKAGE_FILES = ["tandem/__init__.py", "tandem/client.py", "tandem/v1/__init__.py"]
DIST_INFO = f"{NAME}-{VERSION}.dist-info"


class BuildError(Exception):
    """A build that cannot proceed, with what to install or set."""


def _proto_root():
    candidates = [os.environ.get("TANDEM_PROTO_DIR"), os.path.join(HERE, "protos"),
                  os.path.join(HERE, "..", "..", "protos")]
    for root in candidates:
        if root and os.path.isfile(os.path.join(root, PROTO)):
            return os.path.abspath(root)
    raise BuildError(f"tandem-client: {PROTO} not found in $TANDEM_PROTO_DIR, ./protos or ../../protos: build "
                     "from a tandem checkout (pip install ./client/python) or set TANDEM_PROTO_DIR")


def _protoc_command(root, out):
    try:
        import grpc_tools  # noqa: F401  (grpcio-tools: protoc and the gRPC plugin in one)
        return [sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"--python_out={out}",
                f"--grpc_python_out={out}", os.path.join(root, PROTO)]
    except ImportError:
        pass
    protoc, plugin = shutil.which("protoc"), shutil.which("grpc_python_plugin")
    if protoc is None or plugin is None:
        raise BuildError("tandem-client: generating the gRPC stubs needs grpcio-tools (pip) or protoc and "
                         "grpc_python_plugin on PATH (Debian: protobuf-compiler protobuf-compiler-grpc)")
    return [protoc, f"-I{root}", f"--python_out={out}", f"--grpc_python_out={out}",
            f"--plugin=protoc-gen-grpc_python={plugin}", os.path.join(root, PROTO)]


def _stubs():
    """{path in the package: bytes} of the generated inference_pb2{,_grpc}.py."""
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(_protoc_command(_proto_root(), out), capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"tandem-client: protoc failed: {done.stderr.strip()}")
        stubs = {}
        for name in ("inference_pb2.py", "inference_pb2_grpc.py"):
            with open(os.path.join(out, "tandem", "v1", name), "rb") as f:
                stubs[f"tandem/v1/{name}"] = f.read()
        return stubs


def _metadata():
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    lines = ["Metadata-Version: 2.1", f"Name: {NAME.replace('_', '-')}", f"Version: {VERSION}",
             f"Summary: {SUMMARY}", "License: Apache-2.0", f"Requires-Python: {PYTHON}"]
    lines += [f"Requires-Dist: {r}" for r in REQUIRES]
    lines += ["Description-Content-Type: text/markdown", "", readme]
    return "\n".join(lines).encode()


def _wheel_file():
    return b"Wheel-Version: 1.0\nGenerator: tandem_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory, files):
    """A py3-none-any wheel of `files` ({path: bytes}) plus its dist-info; returns its file name."""
    files = dict(files)
    files[f"{DIST_INFO}/METADATA"] = _metadata()
    files[f"{DIST_INFO}/WHEEL"] = _wheel_file()
    files[f"{DIST_INFO}/top_level.txt"] = b"tandem\n"
    record = [_record_line(path, data) for path, data in sorted(files.items())]
    record.append(f"{DIST_INFO}/RECORD,,")
    files[f"{DIST_INFO}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in sorted(files.items()):
            wheel.writestr(zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return name


def _package_files():
    files = {}
    for path in PACKAGE_FILES:
        with open(os.path.join(HERE, path), "rb") as f:
            files[path] = f.read()
    return files


def _fail(error):
    sys.stderr.write(f"{error}\n")
    raise SystemExit(1)


# PEP 517 hooks.

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    try:
        return _write_wheel(wheel_directory, {**_package_files(), **_stubs()})
    except BuildError as e:
        _fail(e)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """PEP 660: a .pth pointing at this folder; the stubs are generated into it (ignored by git)."""
    try:
        for path, data in _stubs().items():
            with open(os.path.join(HERE, path), "wb") as f:
                f.write(data)
        return _write_wheel(wheel_directory, {f"{NAME}.pth": (HERE + "\n").encode()})
    except BuildError as e:
        _fail(e)


def build_sdist(sdist_directory, config_settings=None):
    """The package, this backend and the proto, so the sdist builds without a checkout."""
    try:
        root = _proto_root()
    except BuildError as e:
        _fail(e)
    base = f"{NAME}-{VERSION}"
    name = f"{base}.tar.gz"
    members = {path: os.path.join(HERE, path) for path in
               PACKAGE_FILES + ["pyproject.toml", "tandem_build.py", "README.md"]}
    members[f"protos/{PROTO}"] = os.path.join(root, PROTO)
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as sdist:
        for path, source in sorted(members.items()):
            sdist.add(source, arcname=f"{base}/{path}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata()
        info.size = len(data)
        sdist.addfile(info, io.BytesIO(data))
    return name
