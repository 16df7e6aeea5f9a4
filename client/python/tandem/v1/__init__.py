"""The gRPC stubs of protos/tandem/v1/inference.proto, generated here when the
package is built (setup.py; CMake's tandem_python target for the build tree)."""
