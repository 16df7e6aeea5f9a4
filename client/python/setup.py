"""Builds the tandem Python SDK, generating the gRPC stubs of
protos/tandem/v1/inference.proto into the wheel (tandem/v1/*_pb2*.py).

The proto is found at $TANDEM_PROTO_DIR/tandem/v1/inference.proto, else at
../../protos beside this file (a repository checkout). The compiler is
grpc_tools.protoc when grpcio-tools is importable, else protoc with
grpc_python_plugin on PATH; neither found is an error that says what to
install.
"""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join("tandem", "v1", "inference.proto")


def proto_root():
    root = os.environ.get("TANDEM_PROTO_DIR") or os.path.join(HERE, "..", "..", "protos")
    if not os.path.isfile(os.path.join(root, PROTO)):
        sys.exit(f"tandem-client: {os.path.join(root, PROTO)} not found: build from a tandem checkout "
                 "(pip install ./client/python) or set TANDEM_PROTO_DIR to the folder holding tandem/v1/")
    return os.path.abspath(root)


def protoc_command(root, out):
    try:
        import grpc_tools  # noqa: F401  (grpcio-tools: protoc and the gRPC plugin in one)
        return [sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"--python_out={out}",
                f"--grpc_python_out={out}", os.path.join(root, PROTO)]
    except ImportError:
        pass
    protoc, plugin = shutil.which("protoc"), shutil.which("grpc_python_plugin")
    if protoc is None or plugin is None:
        sys.exit("tandem-client: generating the gRPC stubs needs grpcio-tools (pip) or protoc and grpc_python_plugin "
                 "(Debian: protobuf-compiler protobuf-compiler-grpc)")
    return [protoc, f"-I{root}", f"--python_out={out}", f"--grpc_python_out={out}",
            f"--plugin=protoc-gen-grpc_python={plugin}", os.path.join(root, PROTO)]


class BuildWithStubs(build_py):
    """build_py, then the stubs generated into the build tree's package."""

    def run(self):
        super().run()
        out = os.path.abspath(self.build_lib)
        os.makedirs(os.path.join(out, "tandem", "v1"), exist_ok=True)
        subprocess.run(protoc_command(proto_root(), out), check=True)
        init = os.path.join(out, "tandem", "v1", "__init__.py")
        if not os.path.exists(init):
            open(init, "w").close()


setup(cmdclass={"build_py": BuildWithStubs})
